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


def _read_config_text(path: Path) -> str | None:
    """The text of a project's config file; None when there is none. One that is there but cannot be used (a
    folder, a link to nothing, unreadable, not UTF-8) is an error naming it: skipped, the user's settings and
    secret patterns would be silently replaced by the defaults."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise config_error(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise config_error(f"{path}: cannot be read ({err.strerror or err})") from None


def load_agents_file(project_root: str) -> AgentsFile:
    """The project's agents file, or the defaults (built-in profiles, `claude` for every agent)."""
    for rel in PROFILES_FILES:
        path = Path(project_root, rel)
        if (text := _read_config_text(path)) is not None:
            try:
                return parse_agents_file(text, str(path))
            except AgentProfileError as err:
                raise config_error(str(err)) from None
    return AgentsFile()


def load_template(project_root: str, name: str) -> str:
    """`<project>/.bso/prompts/<name>.md` if present, else BSO's own `bso/prompts/<name>.md`."""
    override = _read_config_text(Path(project_root, ".bso", "prompts", f"{name}.md"))
    return override if override is not None else (BUILTIN_PROMPTS_DIR / f"{name}.md").read_text(encoding="utf-8")


def load_templates(project_root: str, agent_type: AgentType) -> tuple[str, str]:
    return load_template(project_root, agent_type.value), load_template(project_root, COMMON_TEMPLATE)
