"""Agent profiles for the `command` backend: which CLI runs which agent, and how.

A project configures its agents in `.bso/agents.toml` (or `.bso/agents.yaml`). This module is the pure
part: the pydantic models, the built-in profiles, parsing of the file's text and the choice of a
profile for one dispatch. Reading the file is the activity's business.

Example (`.bso/agents.toml`)::

    default_profile = "claude"

    [profiles.claude-opus]
    extends = "claude"
    argv = ["claude", "-p", "{prompt}", "--output-format", "json", "--model", "opus"]

    [agents.review-runner]
    profile = "codex"            # P30: another CLI, and always a fresh session

    [agents.dev-runner.modes.fix]
    profile = "claude-opus"
    timeout_seconds = 2400

    [verification]
    commands = [["pytest", "-q"]]

P30 (the reviewer is never the implementer's session): every dispatch is a new CLI process with a
fresh `{session_id}`; a profile used by a reviewing agent may not carry a session-resume flag.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from io import StringIO
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

# The launcher redacts the agent's transcript standalone (stdlib only, isolated mode): the forms a secret takes
# are defined there, once, for it and for BSO's texts.
from activities.agent_launcher import redact_forms, secret_forms
from bso.messages import map_strings
from bso.states import AgentMode, AgentType

PROFILES_FILES = (".bso/agents.toml", ".bso/agents.yaml", ".bso/agents.yml")
PLACEHOLDERS = ("{prompt}", "{prompt_file}", "{session_id}", "{workdir}", "{result_file}")

# Flags by which CLIs continue an earlier conversation: forbidden for reviewing agents (P30). Short flags that
# mean something else to other CLIs (codex's `-c` sets a config value) count only for the CLIs that use them.
RESUME_FLAGS = frozenset({"--resume", "-r", "--continue", "--session", "--session-id", "resume"})
RESUME_FLAGS_OF_CLI: dict[str, frozenset[str]] = {
    "claude": frozenset({"-c"}),  # --continue
    "opencode": frozenset({"-c", "-s"}),  # --continue, --session
}


def resume_flags(argv: list[str]) -> list[str]:
    """The arguments of `argv` that would continue an earlier session (`--resume=abc` too)."""
    of_cli = RESUME_FLAGS_OF_CLI.get(argv[0].rsplit("/", 1)[-1], frozenset()) if argv else frozenset()
    return [a for a in argv if a.split("=", 1)[0] in RESUME_FLAGS or a.split("=", 1)[0] in of_cli]


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("holds a NUL character, which no command line or environment variable can carry")
    return value


# A string given to a process: its argv or its environment.
ProcessText = Annotated[str, AfterValidator(_no_nul)]


def _env_name(name: str) -> str:
    # An environment entry is NAME=value: the name cannot be empty nor hold '=' (nor a NUL, as no value can).
    wrong = "is empty" if not name else "holds '='" if "=" in name else "holds a NUL" if "\x00" in name else None
    if wrong:
        raise ValueError(
            f"the environment variable name {name!r} {wrong}: write the name alone as the key, as in NAME = \"value\""
        )
    return name


# A profile's or an agent's environment: the names are checked too (each dispatch failed on Python's bare
# "illegal environment variable name", naming neither the key nor the file).
ProcessEnv = dict[Annotated[str, AfterValidator(_env_name)], ProcessText]
REVIEWING_AGENTS = frozenset({AgentType.STORY_REVIEWER, AgentType.REVIEW_RUNNER, AgentType.E2E_INSPECTOR})

# Agents that write the story document work in the project; the others in the story's git worktree.
DEFAULT_WORKDIR: dict[AgentType, str] = {
    AgentType.STORY_CREATOR: "project",
    AgentType.STORY_REVIEWER: "project",
    AgentType.DEV_RUNNER: "worktree",
    AgentType.REVIEW_RUNNER: "worktree",
    AgentType.E2E_INSPECTOR: "worktree",
}


class AgentProfileError(ValueError):
    """An agents file or profile that cannot be used; the message names the profile or the key."""


# A cache write costs at most a few input tokens' worth (1.25 at Anthropic's prices): more is a typo.
MAX_CACHE_WRITE_WEIGHT = 10


def _refuse_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("a number, not true/false")
    return value


# A whole number (`600.0` too, as before) but not a boolean, which pydantic reads as 1 or 0.
_NOT_A_BOOL = BeforeValidator(_refuse_bool)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AgentProfile(_Strict):
    """How to run one coding-agent CLI. `argv` is never given to a shell."""

    argv: list[ProcessText] = Field(default_factory=list)
    prompt_via: Literal["arg", "stdin", "file"] = "arg"
    env: ProcessEnv = Field(default_factory=dict)
    workdir: Literal["worktree", "project"] | None = None  # None: the agent type's default
    timeout_seconds: Annotated[int | None, _NOT_A_BOOL] = Field(default=None, gt=0)  # `true` was 1 second
    output: Literal["json", "jsonl", "text"] = "json"

    @model_validator(mode="after")
    def _placeholders(self) -> AgentProfile:
        joined = "\x00".join(self.argv)
        if self.prompt_via == "arg" and self.argv and "{prompt}" not in joined:
            raise ValueError("prompt_via 'arg' needs a '{prompt}' placeholder in argv")
        if self.prompt_via == "file" and self.argv and "{prompt_file}" not in joined:
            raise ValueError("prompt_via 'file' needs a '{prompt_file}' placeholder in argv")
        return self


class ProfilePatch(_Strict):
    """A user profile: `extends` a built-in or another user profile and overrides its fields."""

    extends: str | None = None
    argv: list[ProcessText] | None = None
    prompt_via: Literal["arg", "stdin", "file"] | None = None
    env: ProcessEnv | None = None
    workdir: Literal["worktree", "project"] | None = None
    timeout_seconds: Annotated[int | None, _NOT_A_BOOL] = Field(default=None, gt=0)  # `true` was 1 second
    output: Literal["json", "jsonl", "text"] | None = None


class AgentChoice(_Strict):
    """Which profile an agent type (or one of its modes) uses, with optional overrides."""

    profile: str | None = None
    env: ProcessEnv = Field(default_factory=dict)
    workdir: Literal["worktree", "project"] | None = None
    timeout_seconds: Annotated[int | None, _NOT_A_BOOL] = Field(default=None, gt=0)  # `true` was 1 second


class AgentSettings(AgentChoice):
    modes: dict[AgentMode, AgentChoice] = Field(default_factory=dict)


class Verification(_Strict):
    """Trust nothing: BSO itself runs these (argv lists, no shell) in the worktree after dev and fix."""

    commands: list[list[ProcessText]] = Field(default_factory=list)
    # For all the commands together, at most 900: the Slave's deadline for a command agent's activity leaves
    # 2 x 900 s for BSO's checks (the fix snapshot, then the verification).
    timeout_seconds: Annotated[int, _NOT_A_BOOL] = Field(900, gt=0, le=900)
    output_tail_chars: Annotated[int, _NOT_A_BOOL] = Field(4000, gt=0)
    # P20 fix snapshot: how passing tests are counted in the commands' output (the numbers are summed).
    passed_pattern: str = r"(\d+) passed"
    fix_snapshot: bool = True

    @field_validator("passed_pattern")
    @classmethod
    def _one_count(cls, pattern: str) -> str:
        try:
            groups = re.compile(pattern).groups
        except re.error as err:
            raise ValueError(f"is not a regular expression ({err})") from None
        if groups != 1:
            raise ValueError(f"needs exactly one group, the count (as in '(\\d+) passed'); {pattern!r} has {groups}")
        return pattern


class GitSettings(_Strict):
    enabled: bool = True
    commit_message: str = Field("bso($agent_type): $story_key: $path", pattern=r"\S")  # git refuses an empty one
    merge: Literal["ff", "merge"] = "ff"
    squash_message: str = Field("feat: Story $story_number: $title", pattern=r"\S")
    secret_patterns: list[str] = Field(
        default_factory=lambda: [
            ".env", ".env.*", ".envrc", "*.pem", "*.key", "id_rsa*", "id_dsa*", "id_ed25519*", "id_ecdsa*", "*.p12",
            "*.pfx", "*.ppk", "credentials", "credentials.json", ".git-credentials", ".netrc", ".npmrc", ".pypirc",
            "*.keystore", "*.tfvars", "secrets.*",
        ]
    )


class TokenSettings(_Strict):
    cache_read_weight: float = Field(0.1, ge=0, le=1, strict=True, allow_inf_nan=False)
    # Bounded and finite: `inf` failed every agent's answer after its work was done, so each ran again.
    cache_write_weight: float = Field(1.0, ge=0, le=MAX_CACHE_WRITE_WEIGHT, strict=True, allow_inf_nan=False)


class AgentsFile(_Strict):
    default_profile: str = "claude"
    profiles: dict[str, ProfilePatch] = Field(default_factory=dict)
    agents: dict[AgentType, AgentSettings] = Field(default_factory=dict)
    verification: Verification = Verification()
    git: GitSettings = GitSettings()
    tokens: TokenSettings = TokenSettings()
    # Finite and bounded: an infinite grace never sends the SIGKILL.
    kill_grace_seconds: float = Field(5.0, gt=0, le=3600, strict=True, allow_inf_nan=False)
    heartbeat_seconds: float = Field(5.0, gt=0, le=3600, strict=True, allow_inf_nan=False)


BUILTIN_PROFILES: dict[str, AgentProfile] = {
    "claude": AgentProfile(argv=["claude", "-p", "{prompt}", "--output-format", "json"]),
    "codex": AgentProfile(argv=["codex", "exec", "--json", "{prompt}"], output="jsonl"),
    "gemini": AgentProfile(argv=["gemini", "-p", "{prompt}", "--output-format", "json"]),
    "aider": AgentProfile(
        argv=["aider", "--yes-always", "--no-pretty", "--message-file", "{prompt_file}"],
        prompt_via="file",
        output="text",
    ),
    "opencode": AgentProfile(argv=["opencode", "run", "--format", "json", "{prompt}"], output="jsonl"),
    # Any command: the prompt on stdin, the AGENT_COMPLETE in $BSO_RESULT_FILE. Needs `argv` from the user.
    "generic": AgentProfile(argv=[], prompt_via="stdin", output="text"),
}


class ResolvedProfile(_Strict):
    """The profile one dispatch runs with, everything decided."""

    name: str
    argv: list[str]
    prompt_via: Literal["arg", "stdin", "file"]
    env: dict[str, str]
    workdir: Literal["worktree", "project"]
    timeout_seconds: int | None
    output: Literal["json", "jsonl", "text"]


def parse_agents_file(text: str, filename: str) -> AgentsFile:
    """Parse `.bso/agents.toml` / `.yaml` text; AgentProfileError names every bad key."""
    try:
        if filename.endswith(".toml"):
            raw: Any = tomllib.loads(text)
        else:
            from ruamel.yaml import YAML

            raw = YAML(typ="safe").load(StringIO(text)) or {}
    except Exception as err:  # tomllib.TOMLDecodeError, ruamel's YAMLError
        raise AgentProfileError(f"{filename}: not valid {'TOML' if filename.endswith('.toml') else 'YAML'}: {err}") from None
    if not isinstance(raw, dict):
        raise AgentProfileError(f"{filename}: the top level must be a table/mapping")
    try:
        parsed = AgentsFile.model_validate(raw)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
        raise AgentProfileError(f"{filename}: {problems}") from None
    for name in parsed.profiles:
        profile_by_name(parsed, name)  # every user profile must resolve, not only the ones used first
    return parsed


# Deeper `extends` chains are refused, not walked: parse_agents_file resolves every profile down its chain (a chain
# of thousands took seconds, and past Python's recursion limit it raised a bare RecursionError).
MAX_EXTENDS_DEPTH = 50


def profile_by_name(agents: AgentsFile, name: str) -> AgentProfile:
    """The profile `name`: the built-in its `extends` chain starts from, with each user profile of the chain
    applied over it in turn (each checked, an AgentProfileError naming the one at fault). A loop through
    `extends`, or a chain past MAX_EXTENDS_DEPTH user profiles, is an AgentProfileError too."""
    chain: list[str] = []  # `name`, the user profile it extends, ..., the last user profile of the chain
    current = name
    while (patch := agents.profiles.get(current)) is not None:
        if current in chain:
            raise AgentProfileError(f"profile {current!r}: 'extends' loops ({' -> '.join((*chain, current))})")
        if len(chain) == MAX_EXTENDS_DEPTH:
            raise AgentProfileError(
                f"profile {name!r}: its 'extends' chain is longer than {MAX_EXTENDS_DEPTH} profiles ({chain[0]} -> "
                f"{chain[1]} -> ... -> {current}): have it extend a built-in profile, or one nearer to it"
            )
        chain.append(current)
        base_name = patch.extends or (current if current in BUILTIN_PROFILES else "generic")
        if base_name == current and current in BUILTIN_PROFILES:  # a user profile named as a built-in overrides it
            break
        current = base_name
    profile = BUILTIN_PROFILES.get(current)
    if profile is None:
        known = sorted({*BUILTIN_PROFILES, *agents.profiles})
        raise AgentProfileError(f"unknown agent profile {current!r}; known: {', '.join(known)}")
    for link in reversed(chain):
        fields = profile.model_dump()
        for key, value in agents.profiles[link].model_dump(exclude={"extends"}).items():
            if value is None:
                continue
            fields[key] = {**fields["env"], **value} if key == "env" else value
        try:
            profile = AgentProfile.model_validate(fields)
        except ValidationError as err:
            raise AgentProfileError(f"profile {link!r}: {err.errors()[0]['msg']}") from None
    return profile


def resolve_profile(agents: AgentsFile, agent_type: AgentType, mode: AgentMode) -> ResolvedProfile:
    """The profile for one dispatch: default <- agent type <- mode override."""
    settings = agents.agents.get(agent_type, AgentSettings())
    mode_choice = settings.modes.get(mode, AgentChoice())
    name = mode_choice.profile or settings.profile or agents.default_profile
    base = profile_by_name(agents, name)
    if not base.argv:
        raise AgentProfileError(f"profile {name!r} has no argv: give the command to run in the agents file")
    env = {**base.env, **settings.env, **mode_choice.env}
    workdir = mode_choice.workdir or settings.workdir or base.workdir or DEFAULT_WORKDIR[agent_type]
    if agent_type is AgentType.DEV_RUNNER and workdir == "project" and agents.git.enabled:
        raise AgentProfileError(
            f"profile {name!r} for dev-runner: workdir 'project' would skip BSO's Exit Gate, secret refusal, scope "
            "guard and verification, which work in the story's git worktree (leave workdir out, or set "
            "[git] enabled = false)"
        )
    timeout = mode_choice.timeout_seconds or settings.timeout_seconds or base.timeout_seconds
    if agent_type in REVIEWING_AGENTS:
        if resumes := resume_flags(base.argv):
            raise AgentProfileError(
                f"profile {name!r} for {agent_type.value}: {resumes[0]!r} would resume an earlier session; "
                "a reviewer must never be the implementer's session (P30)"
            )
    return ResolvedProfile(
        name=name,
        argv=list(base.argv),
        prompt_via=base.prompt_via,
        env=env,
        workdir=workdir,
        timeout_seconds=timeout,
        output=base.output,
    )


def profile_errors(agents: AgentsFile, steps: list[tuple[AgentType, AgentMode]]) -> list[str]:
    """What `resolve_profile` refuses for each of a sprint's dispatch steps, once each: checked before the
    sprint starts, a bad reviewer profile is not found at the first review, after the dev work it wasted."""
    errors: list[str] = []
    for agent_type, mode in steps:
        try:
            resolve_profile(agents, agent_type, mode)
        except AgentProfileError as err:
            if str(err) not in errors:
                errors.append(str(err))
    return errors


def dispatch_session_id(dispatch_id: str) -> str:
    """A fresh, per-dispatch session id (UUID-shaped) for `{session_id}`: no two dispatches share one (P30)."""
    h = hashlib.sha256(dispatch_id.encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-8{h[17:20]}-{h[20:32]}"


def render_argv(argv: list[str], values: dict[str, str]) -> list[str]:
    """Fill the placeholders of an argv in one pass (a `{workdir}` inside the prompt stays as written; never a
    shell). Unknown `{...}` are left as they are."""
    if not values:
        return list(argv)
    pattern = re.compile("|".join(re.escape("{" + key + "}") for key in values))
    return [pattern.sub(lambda m: values[m.group(0)[1:-1]], arg) for arg in argv]


SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
# Names whose values carry a password or a key without saying so (a database URL, a GitHub PAT, a Sentry DSN);
# as suffixes, so that PWD (the current folder) or AUTHOR_NAME are not taken for secrets.
SECRET_SUFFIXES = ("_PAT", "_PWD", "_DSN", "_AUTH", "DATABASE_URL")


def is_secret_env_key(key: str) -> bool:
    """*KEY*, *TOKEN*, *SECRET*, *PASSWORD*..., *_PAT, *DATABASE_URL... (BSO's own BSO_* variables, e.g.
    BSO_STORY_KEY, are not secrets)."""
    upper = key.upper()
    if upper.startswith("BSO_"):
        return False
    return any(marker in upper for marker in SECRET_MARKERS) or upper.endswith(SECRET_SUFFIXES)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if is_secret_env_key(k) else v) for k, v in env.items()}


def redact_values(value: Any, env: dict[str, str]) -> Any:
    """`value` (a model dump: dicts, lists, strings...) with every string redacted (redact_text)."""
    forms = env_secret_forms(env)  # once, not per string
    return map_strings(value, lambda text: redact_forms(text, forms))


def redact_text(text: str, env: dict[str, str]) -> str:
    """Replace every form of each secret-looking env value (of 4+ chars) that occurs in `text` with ***."""
    return redact_forms(text, env_secret_forms(env))


def env_secret_forms(env: dict[str, str]) -> list[str]:
    """The forms redact_text replaces of the secret-looking values of `env`, longest first (secret_forms)."""
    return secret_forms(v for k, v in env.items() if is_secret_env_key(k))
