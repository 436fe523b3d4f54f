"""The simulator's check of requests against Google's discovery documents (tpuwatch/sim/schema.py):
each kind of refusal, with Google's wording, and what Google takes (output-only fields, proto
field names, int64 as numbers, the client libraries' `$alt`)."""

from __future__ import annotations

from typing import Any

import pytest

from tpuwatch.sim import schema

P, Z = "proj", "us-central1-a"
INSERT = f"projects/{P}/zones/{Z}/instances"


def _instance(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "vm", "machineType": f"zones/{Z}/machineTypes/tpu7x-standard-4t",
        "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"},
        "disks": [{"boot": True, "autoDelete": True, "initializeParams": {
            "diskSizeGb": "100", "sourceImage": "projects/debian-cloud/global/images/family/debian-12",
            "diskType": f"zones/{Z}/diskTypes/hyperdisk-balanced"}}],
    }
    body.update(over)
    return body


def _compute(verb: str, path: str, body: Any = None, **query: str) -> schema.Method:
    doc = schema.doc("compute")
    assert doc is not None
    return doc.check_request(verb, path, {k: [v] for k, v in query.items()}, body)


def _refusal(verb: str, path: str, body: Any = None, **query: str) -> schema.Refusal:
    with pytest.raises(schema.Refusal) as caught:
        _compute(verb, path, body, **query)
    return caught.value


def test_the_documents_are_there_so_the_simulator_is_strict() -> None:
    assert schema.strict()


def test_a_valid_insert_passes_with_output_only_fields_proto_names_and_client_query() -> None:
    # kind/id/selfLink are output only: Compute Engine ignores them; `can_ip_forward` is the proto
    # name of canIpForward; int64 may come as a number; `$alt` is what the client libraries send
    body = _instance(kind="compute#instance", id="123", selfLink="https://x/y", can_ip_forward=False)
    body["disks"][0]["initializeParams"]["diskSizeGb"] = 100
    method = _compute("POST", INSERT, body, **{"$alt": "json;enum-encoding=int", "requestId": "u"})
    assert method.id == "compute.instances.insert"


def test_a_bare_machine_type_is_refused_as_google_does() -> None:
    err = _refusal("POST", INSERT, _instance(machineType="tpu7x-standard-4t"))
    assert err.message == ("Invalid value for field 'resource.machineType': 'tpu7x-standard-4t'. "
                           "The URL is malformed.")
    assert (err.code, err.reason) == ("INVALID_ARGUMENT", "invalid")


def test_a_bare_disk_type_is_refused_with_its_field_path() -> None:
    body = _instance()
    body["disks"][0]["initializeParams"]["diskType"] = "hyperdisk-balanced"
    assert _refusal("POST", INSERT, body).message == (
        "Invalid value for field 'resource.disks[0].initializeParams.diskType': 'hyperdisk-balanced'. "
        "The URL is malformed.")


def test_a_template_takes_bare_names() -> None:
    props = {k: v for k, v in _instance(machineType="tpu7x-standard-4t").items() if k != "name"}
    props["disks"][0]["initializeParams"]["diskType"] = "hyperdisk-balanced"
    _compute("POST", f"projects/{P}/global/instanceTemplates", {"name": "t", "properties": props})


def test_an_unknown_field_deep_in_a_nested_object_is_refused() -> None:
    body = _instance()
    body["disks"][0]["initializeParams"]["sizeGb"] = "100"
    assert _refusal("POST", INSERT, body).message == (
        "Invalid JSON payload received. Unknown name \"sizeGb\" at 'resource.disks[0].initializeParams': "
        "Cannot find field.")
    assert _refusal("POST", INSERT, _instance(foo=1)).message == (
        "Invalid JSON payload received. Unknown name \"foo\" at 'resource': Cannot find field.")


def test_a_wrong_json_type_is_refused() -> None:
    err = _refusal("POST", INSERT, _instance(canIpForward="yes"))
    assert err.message == "Invalid value at 'resource.canIpForward' (TYPE_BOOL), \"yes\""
    assert "(TYPE_INT64)" in _refusal("POST", INSERT, _instance(
        disks=[{"initializeParams": {"diskSizeGb": "lots"}}])).message
    assert "TYPE_STRING" in _refusal("POST", INSERT, _instance(labels={"a": 5})).message  # a map's values


def test_a_value_not_in_the_enum_is_refused() -> None:
    err = _refusal("POST", INSERT, _instance(scheduling={"provisioningModel": "CHEAP"}))
    assert err.message == "Invalid value for field 'resource.scheduling.provisioningModel': 'CHEAP'."


def test_a_tpu_enum_and_unknown_field_use_the_proto_path() -> None:
    doc = schema.doc("tpu.v2")
    assert doc is not None
    path = f"v2/projects/{P}/locations/{Z}/nodes"
    with pytest.raises(schema.Refusal) as caught:
        doc.check_request("POST", path, {}, {"acceleratorType": "v4-8", "health": "GREAT"})
    assert caught.value.message == ("Invalid value at 'node.health' (type.googleapis.com/google.cloud.tpu.v2.Node.Health), "
                                    "\"GREAT\"")
    with pytest.raises(schema.Refusal) as caught:
        doc.check_request("POST", path, {}, {"networkConfig": {"enableExternalIps": True, "nope": 1}})
    assert caught.value.message == ("Invalid JSON payload received. Unknown name \"nope\" at 'node.network_config': "
                                    "Cannot find field.")


def test_a_missing_required_parameter_is_refused() -> None:
    err = _refusal("POST", f"projects/{P}/zones/{Z}/instanceGroupManagers/g/resize")
    assert (err.message, err.reason) == ("Required field 'size' not specified", "required")
    _compute("POST", f"projects/{P}/zones/{Z}/instanceGroupManagers/g/resize", size="2")
    err = _refusal("POST", INSERT)  # no body at all
    assert err.message == "Required field 'resource' not specified"


def test_an_unknown_query_parameter_is_refused() -> None:
    err = _refusal("GET", f"projects/{P}/zones/{Z}/instances", pagesize="5")
    assert err.message == ("Invalid JSON payload received. Unknown name \"pagesize\": Cannot bind query parameter. "
                           "Field 'pagesize' could not be found in request message.")
    _compute("GET", f"projects/{P}/zones/{Z}/instances", maxResults="5", filter="name=vm")


def test_a_path_parameter_must_match_its_pattern_and_a_method_must_exist() -> None:
    err = _refusal("GET", f"projects/{P}/zones/{Z}/instances/Bad_Name")
    assert err.message.startswith("Invalid value for field 'instance': 'Bad_Name'. Must be a match of regex")
    assert _refusal("PATCH", f"projects/{P}/zones/{Z}/instances").code == "NOT_FOUND"


def test_recreate_instances_and_a_mig_insert_take_urls_only() -> None:
    mig = f"projects/{P}/zones/{Z}/instanceGroupManagers"
    err = _refusal("POST", f"{mig}/g/recreateInstances", {"instances": ["vm-1"]})
    assert err.message == "Invalid value for field 'resource.instances[0]': 'vm-1'. The URL is malformed."
    _compute("POST", f"{mig}/g/recreateInstances", {"instances": [f"zones/{Z}/instances/vm-1"]})
    err = _refusal("POST", mig, {"name": "g", "instanceTemplate": "tmpl", "targetSize": 1})
    assert err.message == "Invalid value for field 'resource.instanceTemplate': 'tmpl'. The URL is malformed."
    _compute("POST", mig, {"name": "g", "instanceTemplate": f"projects/{P}/global/instanceTemplates/tmpl"})


def test_grpc_requests_are_held_to_the_same_document() -> None:
    schema.check_grpc("v2", "GetNode", {"name": f"projects/{P}/locations/{Z}/nodes/n"})
    with pytest.raises(schema.Refusal, match="Missing required field name"):
        schema.check_grpc("v2", "GetNode", {})
    with pytest.raises(schema.Refusal, match="Must be a match of regex"):
        schema.check_grpc("v2", "DeleteNode", {"name": "n"})


def test_without_the_documents_the_simulator_serves_unchecked_and_says_so_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from importlib import resources

    def missing(package: str) -> Any:
        raise ModuleNotFoundError(f"No module named {package!r}")

    schema.doc.cache_clear()
    schema._say_not_strict.cache_clear()
    monkeypatch.setattr(resources, "files", missing)
    try:
        with caplog.at_level("WARNING"):
            assert not schema.strict()
            schema.check_http("POST", f"/compute/v1/{INSERT}", {}, b'{"machineType": "bare", "foo": 1}')
            schema.check_grpc("v2", "GetNode", {})
        said = [r for r in caplog.records if "google-api-python-client is not installed" in r.getMessage()]
        assert len(said) == 1
    finally:
        monkeypatch.undo()
        schema.doc.cache_clear()
        schema._say_not_strict.cache_clear()
    assert schema.strict()


def test_a_tpu_create_without_a_field_its_description_requires_is_refused() -> None:
    doc = schema.doc("tpu.v2")
    assert doc is not None
    path = f"v2/projects/{P}/locations/{Z}/nodes"
    with pytest.raises(schema.Refusal, match=r"^Missing required field node.runtime_version$"):
        doc.check_request("POST", path, {"nodeId": ["n"]}, {"acceleratorType": "v4-8"})
    with pytest.raises(schema.Refusal, match=r"^Missing required field node.accelerator_config.topology$"):
        schema.check_grpc("v2", "CreateNode", {"parent": f"projects/{P}/locations/{Z}", "nodeId": "n", "node": {
            "runtimeVersion": "v2-alpha-tpuv5", "acceleratorConfig": {"type": "V5P"}}})
    doc.check_request("POST", path, {"nodeId": ["n"]}, {"acceleratorType": "v4-8", "runtime_version": "r"})
    # an update names only what it changes
    doc.check_request("PATCH", f"{path}/n", {"updateMask": ["labels"]}, {"labels": {"a": "b"}})
