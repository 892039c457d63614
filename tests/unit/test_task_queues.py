"""Which task queue a Slave sends its agents to (bso.constants.agent_task_queue); whose a dispatch is."""

import pytest

from bso.constants import agent_task_queue, agents_task_queue_for, of_sprint, slave_workflow_id
from bso.states import AgentBackend


def test_simulated_agents_run_on_the_sprint_queue():
    assert agent_task_queue(AgentBackend.SIMULATED.value, "bso-sprint") == "bso-sprint"
    assert agent_task_queue("simulated", "team-a-bso-sprint") == "team-a-bso-sprint"


def test_real_agents_go_to_the_paired_agents_queue():
    for backend in (AgentBackend.EXTERNAL.value, AgentBackend.COMMAND.value):
        assert agent_task_queue(backend, "bso-sprint") == "bso-agents"
        assert agent_task_queue(backend, "team-a-bso-sprint") == "team-a-bso-agents"


def test_every_backend_has_a_queue():
    # A backend added later goes to the agents queue unless it is declared in-process.
    assert agent_task_queue("some-new-backend", "q") == agents_task_queue_for("q")


def test_a_dispatch_belongs_to_the_sprint_whose_batch_sent_it():
    dispatch = f"{slave_workflow_id('s1', 3)}/1-1/2"
    assert of_sprint(dispatch, "s1")
    assert not of_sprint(dispatch, "s")  # a session id that is a prefix of another's
    assert not of_sprint("s1-other/batch-1/1-1/1", "s1")


def test_the_status_watches_every_activity_of_the_agents_queue():
    """`bso sprint status` names the agents-queue work no worker starts: its list is the agents worker's, less
    the Master's own clean-up at a cancel (an activity added to that worker is watched too, or this fails)."""
    from bso.cli import AGENT_ACTIVITY, AGENTS_QUEUE_ACTIVITIES
    from workers.main import AGENT_ACTIVITIES

    served = {fn.__name__ for fn in AGENT_ACTIVITIES}  # @activity.defn names them after their functions
    assert served == {AGENT_ACTIVITY, *AGENTS_QUEUE_ACTIVITIES, "stop_sprint_agents"}


@pytest.mark.parametrize(
    ("sprint_id", "refused"),
    [("zz/batch-1", True), ("zz/resident-debugger", True), ("a/b/batch-12", True), ("zz", False),
     ("batch-1", False), ("zz/batch-x", False), ("zz/batch-1/more", False), ("sprint-1/resident", False)],
)
def test_a_sprint_id_may_not_be_one_a_sprint_gives_its_children(sprint_id: str, refused: bool):
    from bso.constants import sprint_id_error
    from bso.roster import resident_workflow_id

    assert (sprint_id_error(sprint_id) is not None) is refused
    assert sprint_id_error(slave_workflow_id("zz", 3)) and sprint_id_error(resident_workflow_id("zz", "scrum-master"))


def test_a_sprint_id_is_short_enough_for_its_dispatch_ids():
    """The longest sprint id, with the longest batch number, story key and agent-PO suffix, still makes a dispatch
    id an answer can hold."""
    from bso.constants import MAX_SPRINT_ID_CHARS, sprint_id_error
    from bso.messages import MAX_ID_CHARS

    assert sprint_id_error("s" * MAX_SPRINT_ID_CHARS) is None
    assert sprint_id_error("s" * (MAX_SPRINT_ID_CHARS + 1)) == (
        "sprint id of 101 characters: at most 100 (its agents' dispatch ids carry it)"
    )
    longest = f"{slave_workflow_id('s' * MAX_SPRINT_ID_CHARS, 99999)}/{'9' * 8}-{'9' * 8}z/9999/impl-99"
    assert len(longest) <= MAX_ID_CHARS
