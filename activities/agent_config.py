"""Reading a project's agent configuration (`.bso/agents.toml|yaml`) and prompt templates from disk."""

from __future__ import annotations

from pathlib import Path

from temporalio.exceptions import ApplicationError

from bso.agent_profiles import PROFILES_FILES, AgentProfileError, AgentsFile, parse_agents_file
from bso.prompting import BUILTIN_PROMPTS_DIR, COMMON_TEMPLATE
from bso.states import AgentType


def config_error(message: str) -> ApplicationError:
    """What no retry can fix: a bad agents file, a missing CLI, an unsafe story key or path."""
    return ApplicationError(message, type="AgentConfigError", non_retryable=True)


def load_agents_file(project_root: str) -> AgentsFile:
    """The project's agents file, or the defaults (built-in profiles, `claude` for every agent)."""
    for rel in PROFILES_FILES:
        path = Path(project_root, rel)
        if path.is_file():
            try:
                return parse_agents_file(path.read_text(encoding="utf-8"), str(path))
            except AgentProfileError as err:
                raise config_error(str(err)) from None
    return AgentsFile()


def load_template(project_root: str, name: str) -> str:
    """`<project>/.bso/prompts/<name>.md` if present, else BSO's own `bso/prompts/<name>.md`."""
    override = Path(project_root, ".bso", "prompts", f"{name}.md")
    if override.is_file():
        return override.read_text(encoding="utf-8")
    return (BUILTIN_PROMPTS_DIR / f"{name}.md").read_text(encoding="utf-8")


def load_templates(project_root: str, agent_type: AgentType) -> tuple[str, str]:
    return load_template(project_root, agent_type.value), load_template(project_root, COMMON_TEMPLATE)
