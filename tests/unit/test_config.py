"""Unit tests of bso/config.py: the knobs' defaults (BSO-REFERENCE.md) and how overrides merge and fail."""

from __future__ import annotations

import copy

import pytest
from pydantic import ValidationError

from bso.config import (
    AgentTimeouts,
    ConfigError,
    limits_error,
    ResidentSlots,
    SprintConfig,
    TokenBudget,
    resolve_config,
)
from bso.states import AgentType, Strictness

# --- defaults: the values BSO-REFERENCE.md records ------------------------------------------------


@pytest.fixture(params=["resolve_none", "resolve_empty", "model"])
def defaults(request) -> SprintConfig:
    return {
        "resolve_none": lambda: resolve_config(None),
        "resolve_empty": lambda: resolve_config({}),
        "model": SprintConfig,
    }[request.param]()


def test_batch_and_concurrency_defaults(defaults):
    assert defaults.batch_size == 3
    assert defaults.max_concurrent_slaves == 1


def test_review_defaults(defaults):
    assert defaults.max_review_rounds == 10
    assert defaults.max_story_review_rounds == 3
    assert defaults.story_review_fallback == "ask_user"
    assert defaults.story_review_enabled is True
    assert defaults.review_strictness == "normal"
    assert defaults.strictness is Strictness.NORMAL


def test_review_degradation_defaults(defaults):
    deg = defaults.review_degradation
    assert deg.enabled is True
    assert deg.downgrade_from_round == 3
    assert deg.high_only_from_round == 5
    assert deg.force_intervention_at_round == 8


def test_agent_timeout_defaults(defaults):
    t = defaults.agent_timeout_seconds
    assert (t.story_creation, t.story_review, t.dev_execution, t.code_review, t.e2e_inspection, t.knowledge_research) == (
        900,
        900,
        1800,
        900,
        900,
        600,
    )
    assert defaults.agent_timeout_action == "mark_needs_intervention"


@pytest.mark.parametrize(
    ("agent", "seconds"),
    [
        (AgentType.STORY_CREATOR, 900),
        (AgentType.STORY_REVIEWER, 900),
        (AgentType.DEV_RUNNER, 1800),
        (AgentType.REVIEW_RUNNER, 900),
        (AgentType.E2E_INSPECTOR, 900),
    ],
)
def test_agent_timeout_for_each_agent_type(agent, seconds):
    assert SprintConfig().agent_timeout_seconds.for_agent(agent) == seconds


def test_agent_timeout_for_agent_follows_overrides():
    cfg = resolve_config({"agent_timeout_seconds.dev_execution": 42, "agent_timeout_seconds": {"code_review": 7}})
    assert cfg.agent_timeout_seconds.for_agent(AgentType.DEV_RUNNER) == 42
    assert cfg.agent_timeout_seconds.for_agent(AgentType.REVIEW_RUNNER) == 7
    assert cfg.agent_timeout_seconds.for_agent(AgentType.STORY_CREATOR) == 900


def test_token_budget_defaults(defaults):
    b = defaults.token_budget
    assert b.enabled is True
    assert b.warning_threshold == 0.7
    assert b.action == "pause_and_report"
    assert b.limit > 0


def test_checkpoint_and_git_defaults(defaults):
    assert defaults.first_story_checkpoint == "report"
    assert defaults.git_squash_strategy == "per_story"
    assert defaults.auto_clear_git_track is True


def test_slave_timeout_default(defaults):
    assert defaults.slave_timeout_seconds == 5400


def test_a_research_call_keeps_to_the_lower_of_its_two_timeouts(defaults):
    assert defaults.research_limits().call_timeout_seconds == 600
    lower = defaults.model_copy(update={"agent_timeout_seconds": defaults.agent_timeout_seconds.model_copy(update={"knowledge_research": 90})})
    assert lower.research_limits().call_timeout_seconds == 90
    call = defaults.knowledge_research.model_copy(update={"call_timeout_seconds": 30})
    assert defaults.model_copy(update={"knowledge_research": call}).research_limits().call_timeout_seconds == 30


def test_resident_slot_defaults(defaults):
    r = defaults.resident_slots
    assert r.scrum_master is True
    assert r.knowledge_researcher is True
    assert r.debugger is True
    assert r.e2e_live is False


def test_knowledge_research_defaults(defaults):
    k = defaults.knowledge_research
    assert k.cache_ttl_days == 30
    assert k.max_calls_per_story == 3
    assert k.call_timeout_seconds == 600
    assert k.max_cache_entries == 200


def test_e2e_defaults(defaults):
    assert defaults.e2e_enabled is False
    assert set(defaults.e2e_trigger_tags) == {"frontend", "ui", "web", "page"}


def test_resolve_without_overrides_equals_the_model_defaults():
    assert resolve_config(None) == SprintConfig()
    assert resolve_config({}) == SprintConfig()


# --- overrides -------------------------------------------------------------------------------------


def test_top_level_override():
    cfg = resolve_config({"batch_size": 5, "review_strictness": "strict", "story_review_fallback": "skip_story"})
    assert cfg.batch_size == 5
    assert cfg.strictness is Strictness.STRICT
    assert cfg.story_review_fallback == "skip_story"
    # everything else stays at its default
    assert cfg.max_review_rounds == 10
    assert cfg.agent_timeout_seconds == AgentTimeouts()


def test_nested_override_keeps_sibling_defaults():
    cfg = resolve_config({"token_budget": {"limit": 10}})
    assert cfg.token_budget.limit == 10
    assert cfg.token_budget.enabled is True
    assert cfg.token_budget.warning_threshold == 0.7
    assert cfg.token_budget.action == "pause_and_report"


def test_dotted_override_keeps_sibling_defaults():
    cfg = resolve_config({"token_budget.limit": 10})
    assert cfg.token_budget == TokenBudget(limit=10)
    assert cfg.token_budget.warning_threshold == 0.7
    assert cfg.batch_size == 3


def test_nested_resident_slot_override_keeps_other_slots():
    cfg = resolve_config({"resident_slots": {"e2e_live": True}})
    assert cfg.resident_slots == ResidentSlots(e2e_live=True)
    assert cfg.resident_slots.scrum_master and cfg.resident_slots.debugger and cfg.resident_slots.knowledge_researcher


def test_dotted_and_nested_overrides_of_one_group_combine():
    for overrides in (
        {"token_budget": {"limit": 10}, "token_budget.action": "stop"},
        {"token_budget.action": "stop", "token_budget": {"limit": 10}},
        {"token_budget.action": "stop", "token_budget.limit": 10},
    ):
        cfg = resolve_config(overrides)
        assert cfg.token_budget.limit == 10, overrides
        assert cfg.token_budget.action == "stop", overrides
        assert cfg.token_budget.enabled is True, overrides
        assert cfg.token_budget.warning_threshold == 0.7, overrides


def test_dotted_keys_inside_a_nested_group():
    cfg = resolve_config({"review_degradation": {"enabled": False}, "review_degradation.high_only_from_round": 4})
    assert cfg.review_degradation.enabled is False
    assert cfg.review_degradation.high_only_from_round == 4
    assert cfg.review_degradation.downgrade_from_round == 3
    assert cfg.review_degradation.force_intervention_at_round == 8


def test_overrides_of_several_groups_at_once():
    cfg = resolve_config(
        {
            "knowledge_research.cache_ttl_days": 1,
            "agent_timeout_seconds": {"dev_execution": 60},
            "resident_slots.debugger": False,
            "e2e_enabled": True,
            "e2e_trigger_tags": ["mobile"],
        }
    )
    assert cfg.knowledge_research.cache_ttl_days == 1
    assert cfg.knowledge_research.max_cache_entries == 200
    assert cfg.agent_timeout_seconds.dev_execution == 60
    assert cfg.agent_timeout_seconds.story_creation == 900
    assert cfg.resident_slots.debugger is False
    assert cfg.resident_slots.scrum_master is True
    assert cfg.e2e_enabled is True
    assert tuple(cfg.e2e_trigger_tags) == ("mobile",)


def test_overrides_are_not_mutated():
    overrides = {"token_budget": {"limit": 10}, "token_budget.action": "stop", "resident_slots.debugger": False}
    before = copy.deepcopy(overrides)
    resolve_config(overrides)
    assert overrides == before


def test_max_review_rounds_zero_is_allowed():
    assert resolve_config({"max_review_rounds": 0}).max_review_rounds == 0


@pytest.mark.parametrize("fallback", ["ask_user", "force_pass", "skip_story"])
def test_every_story_review_fallback_is_accepted(fallback):
    assert resolve_config({"story_review_fallback": fallback}).story_review_fallback == fallback


@pytest.mark.parametrize("strictness", ["strict", "normal", "lenient"])
def test_every_strictness_is_accepted(strictness):
    assert resolve_config({"review_strictness": strictness}).strictness is Strictness(strictness)


@pytest.mark.parametrize("value", ["pause", "report", "skip"])
def test_every_first_story_checkpoint_is_accepted(value):
    assert resolve_config({"first_story_checkpoint": value}).first_story_checkpoint == value


@pytest.mark.parametrize("value", ["per_story", "none"])
def test_every_implemented_git_squash_strategy_is_accepted(value):
    assert resolve_config({"git_squash_strategy": value}).git_squash_strategy == value


def test_per_phase_squash_is_refused_until_it_exists():
    with pytest.raises(ConfigError, match="git_squash_strategy.*per_phase squashing is not implemented"):
        resolve_config({"git_squash_strategy": "per_phase"})


def test_config_is_frozen():
    cfg = resolve_config({})
    with pytest.raises(ValidationError):
        cfg.batch_size = 9  # type: ignore[misc]


# --- errors: unknown knobs and wrong values name the knob ------------------------------------------


def _error(overrides) -> str:
    with pytest.raises(ConfigError) as info:
        resolve_config(overrides)
    return str(info.value)


@pytest.mark.parametrize(
    ("overrides", "knob"),
    [
        ({"batch_sise": 4}, "batch_sise"),
        ({"max_review_round": 4}, "max_review_round"),
        ({"token_budget.limt": 10}, "token_budget.limt"),
        ({"token_budget": {"limt": 10}}, "token_budget.limt"),
        ({"resident_slots.e2e-live": True}, "resident_slots.e2e-live"),
        ({"review_degradation": {"force_at": 3}}, "review_degradation.force_at"),
    ],
)
def test_unknown_knob_is_an_error_naming_it(overrides, knob):
    assert knob in _error(overrides)


@pytest.mark.parametrize(
    ("overrides", "knob"),
    [
        ({"batch_size": "three"}, "batch_size"),
        ({"batch_size": [3]}, "batch_size"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"batch_size": 0}, "batch_size"),
        ({"max_concurrent_slaves": 0}, "max_concurrent_slaves"),
        ({"max_review_rounds": -1}, "max_review_rounds"),
        ({"max_story_review_rounds": 0}, "max_story_review_rounds"),
        ({"story_review_fallback": "ask"}, "story_review_fallback"),
        ({"review_strictness": "harsh"}, "review_strictness"),
        ({"story_review_enabled": "maybe"}, "story_review_enabled"),
        ({"first_story_checkpoint": "wait"}, "first_story_checkpoint"),
        ({"git_squash_strategy": "squash"}, "git_squash_strategy"),
        ({"agent_timeout_action": "ignore"}, "agent_timeout_action"),
        ({"e2e_trigger_tags": "ui"}, "e2e_trigger_tags"),
        ({"slave_timeout_seconds": 0}, "slave_timeout_seconds"),
        ({"token_budget": 5}, "token_budget"),
        ({"token_budget.limit": "lots"}, "token_budget.limit"),
        ({"token_budget.limit": 0}, "token_budget.limit"),
        ({"token_budget.warning_threshold": 1.5}, "token_budget.warning_threshold"),
        ({"token_budget.action": "explode"}, "token_budget.action"),
        ({"agent_timeout_seconds.dev_execution": 0}, "agent_timeout_seconds.dev_execution"),
        ({"agent_timeout_seconds": {"code_review": "slow"}}, "agent_timeout_seconds.code_review"),
        ({"resident_slots": {"debugger": "perhaps"}}, "resident_slots.debugger"),
        ({"knowledge_research.cache_ttl_days": 0}, "knowledge_research.cache_ttl_days"),
        ({"review_degradation.enabled": "sometimes"}, "review_degradation.enabled"),
    ],
)
def test_wrong_value_is_an_error_naming_the_knob(overrides, knob):
    assert knob in _error(overrides)


@pytest.mark.parametrize("endless", [float("nan"), float("inf")])
def test_a_warning_threshold_that_is_no_number_is_said_so(endless):
    """A NaN threshold was refused as "less than or equal to 1", which it is not."""
    assert "token_budget.warning_threshold: Input should be a finite number" in _error(
        {"token_budget.warning_threshold": endless}
    )


@pytest.mark.parametrize(
    ("overrides", "knob"),
    [
        ({"slave_timeout_seconds": 10**20}, "slave_timeout_seconds"),
        ({"agent_timeout_seconds.dev_execution": 10**20}, "agent_timeout_seconds.dev_execution"),
        ({"agent_timeout_seconds.story_creation": 300_000_000_000}, "agent_timeout_seconds.story_creation"),
        ({"agent_retry.heartbeat_timeout_seconds": 10**20}, "agent_retry.heartbeat_timeout_seconds"),
        ({"agent_retry.maximum_attempts": 2**31}, "agent_retry.maximum_attempts"),
        ({"agent_retry.initial_interval_seconds": 1e300}, "agent_retry.initial_interval_seconds"),
        ({"agent_retry.initial_interval_seconds": float("inf")}, "agent_retry.initial_interval_seconds"),
        ({"agent_retry.initial_interval_seconds": float("nan")}, "agent_retry.initial_interval_seconds"),
        ({"decision_timeout_seconds": 10**20}, "decision_timeout_seconds"),
        ({"knowledge_research.call_timeout_seconds": 10**20}, "knowledge_research.call_timeout_seconds"),
        ({"knowledge_research.cache_ttl_days": 10**9}, "knowledge_research.cache_ttl_days"),
    ],
)
def test_a_duration_or_count_past_what_a_workflow_can_hold_is_refused_naming_the_knob(overrides, knob):
    """Past these bounds the Slave's timedelta or datetime overflowed (or Temporal's 32-bit attempt count):
    its workflow task failed on every retry and the sprint hung. The model still takes them (it decodes the
    config of sprints started before the bounds); `bso sprint start` and the Master refuse them."""
    try:
        config = resolve_config(overrides)
    except ConfigError as err:  # NaN: not > 0 either
        assert knob in str(err), err
        return
    message = limits_error(config)
    assert message is not None and f"{knob}: at most " in message, message


def test_a_year_is_the_longest_duration() -> None:
    assert limits_error(resolve_config({"slave_timeout_seconds": 366 * 24 * 3600})) is None
    assert limits_error(resolve_config({"slave_timeout_seconds": 366 * 24 * 3600 + 1})) is not None
    assert limits_error(resolve_config({})) is None


@pytest.mark.parametrize(
    ("overrides", "knob"),
    [
        ({"batch_size": True}, "batch_size"),
        ({"max_review_rounds": False}, "max_review_rounds"),
        ({"token_budget.limit": True}, "token_budget.limit"),
    ],
)
def test_boolean_for_a_number_is_a_wrong_type(overrides, knob):
    # JSON `true` is not a count: it must not silently become 1 (or `false` become 0, which would send the
    # first needs-fix of every story to needs-intervention).
    assert knob in _error(overrides)


def test_every_bad_knob_is_named():
    message = _error({"batch_sise": 4, "review_strictness": "harsh", "token_budget.limit": -1})
    assert "batch_sise" in message
    assert "review_strictness" in message
    assert "token_budget.limit" in message


def test_dotted_key_under_a_scalar_knob_is_an_error():
    assert "batch_size" in _error({"batch_size.value": 3})


def test_dotted_key_conflicting_with_a_scalar_override_is_an_error():
    assert "token_budget" in _error({"token_budget": 5, "token_budget.limit": 3})


@pytest.mark.parametrize("overrides", [[("batch_size", 3)], "batch_size=3", 3])
def test_overrides_must_be_an_object(overrides):
    with pytest.raises(ConfigError):
        resolve_config(overrides)  # type: ignore[arg-type]


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_agent_po_names_of_the_gate_limits_are_accepted() -> None:
    assert resolve_config({"max_revisions": 5, "max_retries": 0}).po_max_revisions == 5
    assert resolve_config({"max_retries": 0}).po_max_retries == 0
    assert resolve_config({"po_max_revisions": 4}).po_max_revisions == 4
    with pytest.raises(ConfigError, match="max_revisions and po_max_revisions name the same knob"):
        resolve_config({"max_revisions": 1, "po_max_revisions": 2})


def test_a_key_inside_a_knobs_value_is_the_knobs_own_not_a_dotted_path():
    """A story key of story_priorities was split at its dots: `{"../x": "high"}` was refused as
    `story_priorities.: Input should be 'critical', ...`, naming neither the key nor what was wrong with it."""
    assert resolve_config({"story_priorities": {"1.2": "high", "../x": "low"}}).story_priorities == {
        "1.2": "high", "../x": "low"
    }
    assert resolve_config({"token_budget.limit": 7, "token_budget": {"enabled": False}}).token_budget.limit == 7
