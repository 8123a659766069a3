"""The workplace_assistant environment: tools, fresh state per rollout, state-replay scoring, data."""

from __future__ import annotations

import asyncio
import csv
import json

import pytest

from environments.workplace_assistant import WorkplaceAssistantEnvironment as Workplace
from environments.workplace_assistant.generate_tasks import generate_rows
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import ToolError
from gym_bridge.core.items import function_call_item, message_item
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.core.registry import register, resolve_tasks
from gym_bridge.core.task import load_tasks, parse_task

NEMO_GYM_TOOLS = {
    "company_directory_find_email_address", "email_get_email_information_by_id", "email_search_emails", "email_send_email",
    "email_delete_email", "email_forward_email", "email_reply_email", "calendar_get_event_information_by_id",
    "calendar_search_events", "calendar_create_event", "calendar_delete_event", "calendar_update_event",
    "analytics_get_visitor_information_by_id", "analytics_create_plot", "analytics_total_visits_count",
    "analytics_engaged_users_count", "analytics_traffic_source_count", "analytics_get_average_session_duration",
    "project_management_get_task_information_by_id", "project_management_search_tasks", "project_management_create_task",
    "project_management_delete_task", "project_management_update_task", "customer_relationship_manager_search_customers",
    "customer_relationship_manager_update_customer", "customer_relationship_manager_add_customer",
    "customer_relationship_manager_delete_customer",
}


def row(*ground_truth: tuple[str, dict], **extra) -> dict:
    return {"prompt": "Do the thing.", "world_seed": 0, "environment": "workplace_assistant",
            "ground_truth": [{"name": name, "arguments": json.dumps(args)} for name, args in ground_truth], **extra}


def calls(*pairs: tuple[str, dict | str]) -> list[dict]:
    return [function_call_item(name, args if isinstance(args, str) else json.dumps(args), call_id=f"c{i}", item_id=f"f{i}")
            for i, (name, args) in enumerate(pairs)]


def score(task_row: dict, *pairs: tuple[str, dict | str]):
    task = parse_task(task_row, index=0)
    return Workplace().verify(task, [*calls(*pairs), message_item("Done.", item_id="m")])


def session(seed: int = 0) -> Workplace:
    env = Workplace()
    env.setup(parse_task(row(world_seed=seed), index=0))
    return env


PLOT_A = ("analytics_create_plot", {"time_min": "2024-05-01", "time_max": "2024-05-07", "value_to_plot": "total_visits", "plot_type": "line"})
PLOT_B = ("analytics_create_plot", {"time_min": "2024-05-01", "time_max": "2024-05-07", "value_to_plot": "user_engaged", "plot_type": "bar"})
MOVE = ("project_management_update_task", {"task_id": "00000001", "field": "list_name", "new_value": "Completed"})
EVENT_1 = ("calendar_create_event", {"event_name": "Budget Review", "participant_email": "grace.kim@orbitech.com",
                                     "event_start": "2024-05-20 10:00:00", "duration": "30"})
EVENT_2 = ("calendar_create_event", {"event_name": "Risk Workshop", "participant_email": "dev.sharma@orbitech.com",
                                     "event_start": "2024-05-21 14:00:00", "duration": "60"})


def test_the_27_tools_are_nemo_gyms_across_six_domains() -> None:
    assert set(Workplace.tool_specs()) == NEMO_GYM_TOOLS
    domains = {name.split("_")[0] for name in NEMO_GYM_TOOLS}
    assert domains == {"company", "email", "calendar", "analytics", "project", "customer"}
    send = Workplace.tool_specs()["email_send_email"].schema["parameters"]
    assert (set(send["properties"]), set(send["required"])) == ({"recipient", "subject", "body"}, {"recipient", "subject", "body"})
    search = Workplace.tool_specs()["email_search_emails"].schema["parameters"]
    assert set(search["properties"]) == {"query", "date_min", "date_max", "page", "page_size"} and search["required"] == []


def test_each_toolset_holds_one_domains_tools() -> None:
    prefixes = {"Directory": "company_directory_", "Email": "email_", "Calendar": "calendar_", "Analytics": "analytics_",
                "ProjectManagement": "project_management_", "CustomerRelationshipManager": "customer_relationship_manager_"}
    assert [toolset.__name__ for toolset in Workplace.toolsets] == list(prefixes)
    tools_by_toolset = {toolset.__name__: {name for name, value in vars(toolset).items() if getattr(value, "__gym_bridge_tool__", False)}
                        for toolset in Workplace.toolsets}
    assert set().union(*tools_by_toolset.values()) == NEMO_GYM_TOOLS
    for toolset, names in tools_by_toolset.items():
        assert names and all(name.startswith(prefixes[toolset]) for name in names), toolset


def test_rows_carrying_nemo_gym_tool_schemas_route_and_match() -> None:
    register(Workplace)
    nemo_schema = {"type": "function", "name": "email_reply_email", "description": "Replies to an email by its ID.",
                   "parameters": {"type": "object", "properties": {"email_id": {"type": "string"}, "body": {"type": "string"}},
                                  "required": ["email_id", "body"], "additionalProperties": False}, "strict": False}
    task = parse_task({**row(), "environment": None, "agent_ref": {"name": "workplace_assistant_simple_agent"},
                       "responses_create_params": {"input": "hi", "tools": [nemo_schema]}}, index=0)
    assert resolve_tasks([task]) == {"workplace_assistant_simple_agent": Workplace}


def test_tools_read_the_seeded_world_and_errors_are_tool_errors() -> None:
    env = session()
    assert env.company_directory_find_email_address(name="grace") == ["grace.kim@orbitech.com"]
    found = env.email_search_emails(query="task update", page_size=3)
    assert len(found["emails"]) == 3 and found["pagination"]["total_emails"] > 3
    dates = [email["sent_datetime"] for email in found["emails"]]
    assert dates == sorted(dates, reverse=True)
    assert env.project_management_get_task_information_by_id(task_id="00000001", field="task_id") == {"task_id": "00000001"}
    for bad in (lambda: env.email_delete_email(email_id="99999999"),
                lambda: env.calendar_create_event(event_name="x", participant_email="not-an-address", event_start="2024-05-20 10:00", duration="30"),
                lambda: env.calendar_create_event(event_name="x", participant_email="a@b.com", event_start="next tuesday", duration="30"),
                lambda: env.project_management_update_task(task_id="00000001", field="list_name", new_value="Done"),
                lambda: env.customer_relationship_manager_update_customer(customer_id="00000001", field="status", new_value="won"),
                lambda: env.project_management_search_tasks(),
                lambda: env.analytics_create_plot(time_min="2024-05-01", time_max="2024-05-02", value_to_plot="revenue", plot_type="bar")):
        with pytest.raises(ToolError):
            bad()


def test_each_rollout_gets_a_fresh_world() -> None:
    first, second = session(), session()
    first.email_delete_email(email_id="00000001")
    assert second.email_get_email_information_by_id(email_id="00000001", field="email_id") == {"email_id": "00000001"}
    assert session().email_get_email_information_by_id(email_id="00000001", field="email_id") == {"email_id": "00000001"}
    assert session(0).email_search_emails(page_size=80) != session(1).email_search_emails(page_size=80)  # another seed, another world


def test_the_ground_truth_calls_score_1_and_doing_nothing_scores_0() -> None:
    task_row = row(MOVE)
    result = score(task_row, MOVE)
    assert result.reward == 1.0 and result.reward_components == {"state_match": 1.0}
    assert score(task_row).reward == 0.0
    assert score(task_row, ("project_management_update_task", {**MOVE[1], "new_value": "In Review"})).reward == 0.0
    assert score(task_row, ("project_management_update_task", {**MOVE[1], "task_id": "00000002"})).reward == 0.0


def test_a_correct_sequence_in_another_order_scores_1_where_order_does_not_matter() -> None:
    # two independent plots, a reply and a task move, two new events (their new ids differ by order)
    assert score(row(PLOT_A, PLOT_B), PLOT_B, PLOT_A).reward == 1.0
    reply = ("email_reply_email", {"email_id": "00000003", "body": "Thanks!"})
    assert score(row(reply, MOVE), MOVE, reply).reward == 1.0
    assert score(row(EVENT_1, EVENT_2), EVENT_2, EVENT_1).reward == 1.0
    # searches and lookups before, between and after change nothing
    lookups = [("email_search_emails", {"query": "budget"}), ("company_directory_find_email_address", {"name": "dev"})]
    assert score(row(EVENT_1, EVENT_2), lookups[0], EVENT_1, lookups[1], EVENT_2).reward == 1.0


def test_order_matters_where_a_call_depends_on_an_earlier_one() -> None:
    # create then rename the new event (id 00000061 in world 0) vs rename first: that rename fails, the names differ
    rename = ("calendar_update_event", {"event_id": "00000061", "field": "event_name", "new_value": "Renamed"})
    assert score(row(EVENT_1, rename), EVENT_1, rename).reward == 1.0
    assert score(row(EVENT_1, rename), rename, EVENT_1).reward == 0.0


def test_case_and_whitespace_are_normalised_except_in_status_list_and_board() -> None:
    loose = ("calendar_create_event", {**EVENT_1[1], "event_name": "  budget   REVIEW ", "participant_email": "Grace.Kim@orbitech.com",
                                       "event_start": "2024-05-20T10:00"})
    assert score(row(EVENT_1), loose).reward == 1.0
    status = ("customer_relationship_manager_update_customer", {"customer_id": "00000001", "field": "status", "new_value": "Won"})
    wrong_case = (status[0], {**status[1], "new_value": "WON"})  # the tool rejects it, so nothing changes
    assert score(row(status), status).reward == 1.0
    assert score(row(status), wrong_case).reward == 0.0


def test_extra_changes_and_bad_calls() -> None:
    extra = ("email_delete_email", {"email_id": "00000002"})
    assert score(row(MOVE), MOVE, extra).reward == 0.0
    # malformed JSON, unknown tools, unknown fields and wrong types are failed calls: no crash, no change
    result = score(row(MOVE), ("project_management_update_task", '{"task_id": "00000001", "field": '), ("rm_rf", {}),
                   ("email_delete_email", {"email_id": 7}), ("email_delete_email", {"id": "00000002"}), MOVE)
    assert result.reward == 1.0
    assert result.metrics["failed_tool_calls"] == 4
    # a ground truth of no change: a model that changes nothing is right
    assert score(row(), ("email_search_emails", {"query": "x"})).reward == 1.0


def test_a_row_without_ground_truth_is_a_masked_verifier_failure() -> None:
    result = score({"prompt": "x", "world_seed": 0, "environment": "workplace_assistant"}, MOVE)
    assert (result.mask_sample, result.failure_kind) == (True, "verifier")


def test_a_scripted_rollout_sees_tool_errors_as_output_and_recovers(smol_template, turn) -> None:
    wrong = '<tool_call>{"name": "project_management_update_task", "arguments": {"task_id": "123", "field": "list_name", "new_value": "Completed"}}</tool_call>'
    right = '<tool_call>{"name": "project_management_update_task", "arguments": ' + json.dumps(MOVE[1]) + "}</tool_call>"
    engine = Engine(ScriptedPolicy({"": [turn(wrong), turn(right), turn("Done.")]}), smol_template, EngineConfig())

    async def collect():
        return [record async for record in engine.stream([parse_task(row(MOVE), index=0)])]

    register(Workplace)
    [record] = asyncio.run(collect())
    outputs = [item["output"] for item in record.output if item["type"] == "function_call_output"]
    assert json.loads(outputs[0]) == {"error": "task '123' not found"}
    assert json.loads(outputs[1]) == {"task_id": "00000001", "status": "updated"}
    assert (record.reward, record.failure_kind) == (1.0, None)


def test_example_data_covers_every_domain_and_its_ground_truth_changes_the_state() -> None:
    tasks = load_tasks(Workplace.example_data)
    assert len(tasks) >= 60
    categories = {task.get("category") for task in tasks}
    assert {f"workplace_assistant_{d}" for d in ("email", "calendar", "analytics", "project_management",
                                                 "customer_relationship_manager", "company_directory")} <= categories
    initial = Workplace.replay(tasks[0], []).state
    for task in tasks:
        assert Workplace.validate_row(task.row) == []
        truth = [(call["name"], call["arguments"]) for call in task.get("ground_truth")]
        replayed = Workplace.replay(task, truth)
        assert replayed.failed_calls == 0, task.source
        assert replayed.state != initial, task.source


def test_the_example_file_is_what_the_seeded_generator_writes() -> None:
    rows = [json.loads(line) for line in Workplace.example_data.read_text().splitlines()]
    assert generate_rows(per_category=10, seed=0) == rows


def test_prepare_rows_is_seeded_and_keeps_validation_in_another_world() -> None:
    train = Workplace.prepare_rows(split="train", size=9, seed=5)
    assert train == Workplace.prepare_rows(split="train", size=9, seed=5) and len(train) == 9
    validation = Workplace.prepare_rows(split="validation", size=9, seed=5)
    assert {r["world_seed"] for r in train} == {0} and {r["world_seed"] for r in validation} == {1}


def write_nemo_gym_csv(folder) -> None:
    """A tiny csv_data folder in NeMo Gym's layout."""
    tables = {
        "processed/emails.csv": [["email_id", "inbox/outbox", "sender/recipient", "subject", "sent_datetime", "body"],
                                 ["00000057", "inbox", "carlos.rodriguez@atlas.com", "Task Update", "2023-11-29 10:00:00", "Done."]],
        "processed/calendar_events.csv": [["event_id", "event_name", "participant_email", "event_start", "duration"],
                                          ["00000252", "sync up", "carlos.rodriguez@atlas.com", "2023-12-01 15:00:00", "30"]],
        "processed/project_tasks.csv": [["task_id", "task_name", "assigned_to_email", "list_name", "due_date", "board"],
                                        ["00000149", "Add animation", "carlos.rodriguez@atlas.com", "Backlog", "2023-11-27", "Front end"]],
        "processed/customer_relationship_manager_data.csv": [
            ["customer_id", "assigned_to_email", "customer_name", "customer_email", "customer_phone", "last_contact_date",
             "product_interest", "status", "follow_up_by", "notes"],
            ["00000189", "carlos.rodriguez@atlas.com", "Taylor Jackson", "taylor@nanolabs", "", "2023-11-30 23:59:00", "Consulting", "Lost",
             "2023-12-22 23:59:00", "Had a call."]],
        "processed/analytics_data.csv": [["date_of_visit", "visitor_id", "page_views", "session_duration_seconds", "traffic_source", "user_engaged"],
                                         ["2023-10-22", "0860", "8", "4", "referral", "False"]],
        "raw/email_addresses.csv": [["carlos.rodriguez@atlas.com"]],
    }
    for name, lines in tables.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as handle:
            csv.writer(handle).writerows(lines)


def test_nemo_gym_rows_play_in_nemo_gyms_csv_data(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    reply = ("email_reply_email", {"email_id": "00000057", "body": "Thanks for the update"})
    nemo_row = {"responses_create_params": {"input": [{"role": "user", "content": "Reply to carlos's last email."}]},
                "ground_truth": [{"name": reply[0], "arguments": json.dumps(reply[1])}], "category": "workplace_assistant_email",
                "environment_name": "workplace_assistant", "id": 0, "agent_ref": {"name": "workplace_assistant_simple_agent"}}
    monkeypatch.delenv("GYM_BRIDGE_WORKPLACE_CSV_DIR", raising=False)
    assert [p.field for p in Workplace.validate_row(nemo_row)] == ["world_seed"]
    assert score(nemo_row, reply).failure_kind == "verifier"
    write_nemo_gym_csv(tmp_path)
    monkeypatch.setenv("GYM_BRIDGE_WORKPLACE_CSV_DIR", str(tmp_path))
    assert Workplace.validate_row(nemo_row) == []
    assert score(nemo_row, reply).reward == 1.0
    assert score(nemo_row, ("email_reply_email", {**reply[1], "email_id": "00000058"})).reward == 0.0
    env = Workplace()
    env.setup(parse_task(nemo_row, index=0))
    assert env.email_send_email(recipient="a@b.com", subject="s", body="b")["email_id"] == "00000058"
    assert env.email_search_emails(query="a@b.com")["emails"][0]["sent_datetime"] == "2023-11-30 23:59:00"
