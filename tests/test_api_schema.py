"""The OpenAPI 3 schema lists every endpoint, commands included, documents the one error shape,
and passes drf-spectacular's own validation without warnings. Schema and docs are open to
anonymous users: the API's shape is no secret, and automation needs it before it has a token."""

import re

import pytest
import yaml
from django.core.management import call_command

ENDPOINTS = {
    "/api/clusters/": {"get", "post"},
    "/api/clusters/{id}/": {"get", "patch", "delete"},
    "/api/nodes/": {"get", "post"},
    "/api/nodes/{id}/": {"get", "patch", "delete"},
    "/api/nodes/{id}/cordon/": {"post"},
    "/api/nodes/{id}/uncordon/": {"post"},
    "/api/nodes/{id}/join-set/": {"post"},
    "/api/nodes/{id}/leave-set/": {"post"},
    "/api/nodes/{id}/drain/": {"post"},
    "/api/nodes/{id}/drain-blockers/": {"get"},
    "/api/nodes/{id}/dedicate/": {"post"},
    "/api/nodes/{id}/release/": {"post"},
    "/api/nodes/{id}/recovery/": {"get"},
    "/api/nodes/{id}/recovery/clear/": {"post"},
    "/api/nodes/{id}/power-cycle/": {"post"},
    "/api/clusters/{id}/recovery-policy/": {"get", "put"},
    "/api/nodes/{id}/provisioning/": {"get", "post"},
    "/api/gpus/": {"get"},
    "/api/gpus/{id}/": {"get"},
    "/api/gpus/{id}/health/": {"post"},
    "/api/gpus/{id}/module-id/": {"post"},
    "/api/capacity-sets/": {"get", "post"},
    "/api/capacity-sets/{id}/": {"get", "patch", "delete"},
    "/api/capacity-sets/{id}/rerank/": {"post"},
    "/api/capacity-sets/{id}/drain/": {"post"},
    "/api/pools/": {"get", "post"},
    "/api/pools/{id}/": {"get", "patch", "delete"},
    "/api/pools/{id}/floor/": {"post"},
    "/api/images/": {"get", "post"},
    "/api/images/{id}/": {"get", "patch", "delete"},
    "/api/tenants/": {"get"},
    "/api/tenants/{id}/": {"get"},
    "/api/tenants/{id}/members/": {"get"},
    "/api/tenants/{id}/dedicated-nodes/": {"get"},
    "/api/tenants/{id}/invitations/": {"get", "post"},
    "/api/tenants/{id}/invitations/{invitation_id}/": {"delete"},
    "/api/tenants/{id}/members/{membership_id}/": {"patch", "delete"},
    "/api/token/": {"post"},
    "/api/vms/": {"get", "post"},
    "/api/vms/{id}/": {"get", "delete"},
    "/api/vms/{id}/stop/": {"post"},
    "/api/vms/{id}/start/": {"post"},
    "/api/vms/{id}/terminate-job/": {"post"},
    "/api/vms/{id}/place/": {"post"},
    "/api/vms/{id}/reclaim/": {"post"},
    "/api/notices/": {"get"},
    "/api/notices/{id}/": {"get"},
    "/api/plans/": {"get"},
    "/api/plans/{id}/": {"get"},
    "/api/plans/{id}/approve/": {"post"},
    "/api/capacity-sets/{id}/plan/": {"get"},
    "/api/capacity-sets/{id}/mode/": {"post"},
    "/api/capacity-sets/{id}/what-if/": {"post"},
    "/api/capacity-sets/{id}/schedule/": {"get", "post"},
    "/api/capacity-sets/{id}/schedule/{name}/": {"get", "put", "delete"},
    "/api/capacity-sets/{id}/overrides/": {"get", "post"},
    "/api/capacity-sets/{id}/overrides/{name}/": {"get", "delete"},
    "/api/capacity-sets/{id}/policy/": {"get"},
    "/api/capacity-sets/{id}/load-profile/": {"get"},
    "/api/capacity-sets/{id}/simulate/": {"post"},
    "/api/capacity-sets/{id}/simulations/": {"get"},
    "/api/simulations/{id}/": {"get"},
    "/api/deployments/": {"get", "post"},
    "/api/deployments/{id}/": {"get", "patch"},
    "/api/api-keys/": {"get", "post"},
    "/api/api-keys/{id}/": {"get"},
    "/api/api-keys/{id}/revoke/": {"post"},
    "/api/usage/": {"get"},
    "/api/quotas/": {"get", "post"},
    "/api/quotas/{id}/": {"get", "patch", "delete"},
    "/api/reservations/": {"get", "post"},
    "/api/reservations/{id}/": {"get", "patch", "delete"},
    "/api/capacity-sets/{id}/reservations/": {"get"},
    "/api/bare-metal/": {"get", "post"},
    "/api/bare-metal/{id}/": {"get"},
    "/api/bare-metal/{id}/power/": {"post"},
    "/api/bare-metal/{id}/end/": {"post"},
    "/api/bare-metal/{id}/reclaim/": {"post"},
    "/api/bare-metal/{id}/reimage/": {"post"},
    "/api/bare-metal-images/": {"get", "post"},
    "/api/bare-metal-images/{id}/": {"get", "patch", "delete"},
    "/api/nodes/{id}/bmc/": {"get", "put", "delete"},
    "/api/bmc/discoveries/": {"get", "post"},
    "/api/bmc/discoveries/{id}/": {"get"},
    "/api/bmc/discoveries/{id}/apply/": {"post"},
}

# Command -> (request component or None, response component).
COMMANDS = {
    "/api/nodes/{id}/cordon/": (None, "Node"),
    "/api/nodes/{id}/uncordon/": (None, "Node"),
    "/api/nodes/{id}/join-set/": ("NodeJoinSetRequest", "Node"),
    "/api/nodes/{id}/leave-set/": (None, "Node"),
    "/api/gpus/{id}/health/": ("GpuHealthRequest", "Gpu"),
    "/api/gpus/{id}/module-id/": ("GpuModuleIdRequest", "Gpu"),
    "/api/capacity-sets/{id}/rerank/": ("CapacitySetRerankRequest", "CapacitySet"),
    "/api/pools/{id}/floor/": ("PoolFloorRequest", "Pool"),
    "/api/nodes/{id}/drain/": (None, "Drain"),
    "/api/capacity-sets/{id}/drain/": (None, "CapacitySetDrain"),
    "/api/nodes/{id}/dedicate/": ("DedicateRequest", "Dedication"),
    "/api/nodes/{id}/release/": (None, "Release"),
    "/api/nodes/{id}/recovery/clear/": (None, "NodeRecovery"),
    "/api/vms/{id}/reclaim/": ("ReclaimRequest", "Notice"),
    "/api/plans/{id}/approve/": (None, "PlanDetail"),
    "/api/capacity-sets/{id}/mode/": ("CapacitySetModeRequest", "CapacitySetModeResult"),
    "/api/capacity-sets/{id}/what-if/": ("WhatIfRequest", "WhatIfPreview"),
    "/api/api-keys/{id}/revoke/": (None, "ApiKey"),
    "/api/capacity-sets/{id}/schedule/": ("ScheduleEntryCreateRequest", "ScheduleEntry"),
    "/api/capacity-sets/{id}/overrides/": ("PolicyOverrideSetRequest", "PolicyOverride"),
    "/api/bare-metal/{id}/end/": (None, "BareMetalRental"),
    "/api/bare-metal/{id}/reclaim/": (None, "OperatorRental"),
}

# Errors that carry more than the one shape, still built on it: a refused approval answers
# the fresh plan and what changed along with its `error`.
# A refused apply of a discovery answers the fresh preview along with its `error`.
RICHER_ERRORS = {
    ("/api/plans/{id}/approve/", "409"): "StalePlanError",
    ("/api/bmc/discoveries/{id}/apply/", "409"): "StaleDiscoveryError",
}


@pytest.fixture
def schema(anonymous_api) -> dict:
    response = anonymous_api.get("/api/schema/")
    assert response.status_code == 200
    return yaml.safe_load(response.content)


def ref(component: str) -> dict:
    return {"$ref": f"#/components/schemas/{component}"}


def test_schema_is_openapi_3_and_lists_every_endpoint(schema):
    assert schema["openapi"].startswith("3.")
    listed = {
        path: {method for method in operations if method != "parameters"}
        for path, operations in schema["paths"].items()
    }
    assert listed == ENDPOINTS


@pytest.mark.parametrize(("path", "components"), COMMANDS.items())
def test_every_command_documents_its_request_and_response(schema, path, components):
    request, response = components
    operation = schema["paths"][path]["post"]
    if request is None:
        assert "requestBody" not in operation
    else:
        assert operation["requestBody"]["content"]["application/json"]["schema"] == ref(request)
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == ref(response)


def test_a_simulation_is_asked_for_with_its_request_and_answered_202_with_the_run(schema):
    operation = schema["paths"]["/api/capacity-sets/{id}/simulate/"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body == ref("SimulateRequest")
    answer = operation["responses"]["202"]["content"]["application/json"]["schema"]
    assert answer == ref("SimulationRunDetail")
    state = schema["components"]["schemas"]["SimulationRun"]["properties"]["state"]
    assert state == ref("SimulationStateEnum")


def test_a_discovery_is_asked_for_and_applied_with_202_and_the_run(schema):
    create = schema["paths"]["/api/bmc/discoveries/"]["post"]
    body = create["requestBody"]["content"]["application/json"]["schema"]
    assert body == ref("DiscoveryRequestRequest")
    for path in ("/api/bmc/discoveries/", "/api/bmc/discoveries/{id}/apply/"):
        answer = schema["paths"][path]["post"]["responses"]["202"]["content"]
        assert answer["application/json"]["schema"] == ref("DiscoveryRun")
    components = schema["components"]["schemas"]
    state = components["DiscoveryRun"]["properties"]["state"]
    assert state == {"allOf": [ref("DiscoveryStateEnum")], "readOnly": True}
    # The password is taken, never answered.
    assert components["DiscoveryEntryRequest"]["properties"]["password"]["writeOnly"] is True
    assert "password" not in components["DiscoveryStoredEntry"]["properties"]
    assert "password" not in components["BmcCredential"]["properties"]


def test_a_power_cycle_is_asked_for_with_no_body_and_answered_202_with_the_recovery(schema):
    operation = schema["paths"]["/api/nodes/{id}/power-cycle/"]["post"]
    assert "requestBody" not in operation
    answer = operation["responses"]["202"]["content"]["application/json"]["schema"]
    assert answer == ref("NodeRecovery")
    policy = schema["paths"]["/api/clusters/{id}/recovery-policy/"]["put"]
    body = policy["requestBody"]["content"]["application/json"]["schema"]
    assert body == ref("RecoveryPolicyUpdateRequest")
    assert policy["responses"]["200"]["content"]["application/json"]["schema"] == ref(
        "RecoveryPolicy"
    )


def test_a_provisioning_is_asked_for_with_its_image_and_answered_201_with_the_run(schema):
    operations = schema["paths"]["/api/nodes/{id}/provisioning/"]
    body = operations["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == ref("ProvisionRequest")
    answer = operations["post"]["responses"]["201"]["content"]["application/json"]["schema"]
    assert answer == ref("Provisioning")
    read = operations["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert read == ref("NodeProvisioning")
    states = schema["components"]["schemas"]["ProvisioningStateEnum"]["enum"]
    assert states == ["inserting", "booting", "waiting", "done", "failed"]


def test_create_and_update_take_input_shapes_and_answer_with_the_full_object(schema):
    create = schema["paths"]["/api/nodes/"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"] == ref(
        "NodeCreateRequest"
    )
    assert create["responses"]["201"]["content"]["application/json"]["schema"] == ref("Node")
    update = schema["paths"]["/api/nodes/{id}/"]["patch"]
    assert update["requestBody"]["content"]["application/json"]["schema"] == ref(
        "PatchedNodeUpdateRequest"
    )
    writable = set(schema["components"]["schemas"]["PatchedNodeUpdateRequest"]["properties"])
    assert writable == {"partitions", "bmc_address", "labels", "guest_bridge", "guest_subnet"}


def test_every_operation_documents_the_error_shape(schema):
    error = schema["components"]["schemas"]["ApiError"]
    assert error["properties"]["error"] == ref("ApiErrorBody")
    body = schema["components"]["schemas"]["ApiErrorBody"]
    assert set(body["properties"]) == {"code", "message", "fields"}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            errors = {code for code in operation["responses"] if code >= "400"}
            # Any request may be refused (a query parameter with a control character), and
            # fail on our side or for want of Redis.
            assert {"400", "500", "503"} <= errors, (method, path)
            if path == "/api/token/":
                # Needs no credentials, and is throttled per client address.
                assert errors == {"400", "413", "429", "500", "503"}
                continue
            assert {"401", "403"} <= errors, (method, path)
            if method in ("post", "patch"):
                assert "413" in errors, (method, path)
            for code in errors:
                content = operation["responses"][code]["content"]["application/json"]
                richer = RICHER_ERRORS.get((path, code))
                if richer is not None:
                    assert content["schema"] == ref(richer)
                    component = schema["components"]["schemas"][richer]
                    assert component["properties"]["error"] == ref("ApiErrorBody")
                    continue
                assert content["schema"] == ref("ApiError")


def test_token_endpoint_needs_no_authentication(schema):
    assert "security" not in schema["paths"]["/api/token/"]["post"]
    assert "security" in schema["paths"]["/api/nodes/"]["get"]


def test_schema_as_json(anonymous_api, db):
    response = anonymous_api.get("/api/schema/?format=json")
    assert response.status_code == 200
    assert "/api/pools/{id}/floor/" in response.json()["paths"]


@pytest.mark.parametrize(
    ("path", "bundle"), [("/api/docs/", "swagger-ui"), ("/api/redoc/", "redoc")]
)
def test_the_api_docs_render_from_the_projects_own_static_files(anonymous_api, db, path, bundle):
    response = anonymous_api.get(path)
    page = response.content.decode()
    scripts = re.findall(r'src="([^"]+)"', page)
    # Swagger UI's start-up script is served apart (the CSP allows no inline script).
    own = [src for src in scripts if src.startswith(f"{path}?")]
    started = "".join(anonymous_api.get(src).content.decode() for src in own)

    assert response.status_code == 200
    assert "/api/schema/" in page + started
    assert any(bundle in src for src in scripts)
    # No CDN: every script the page loads is this site's (it works without the internet).
    assert scripts and all(src.startswith("/static/") for src in set(scripts) - set(own)), scripts


def test_schema_passes_spectacular_validation_without_warnings(tmp_path, db):
    target = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    assert "/api/nodes/{id}/join-set/" in yaml.safe_load(target.read_text())["paths"]


def test_only_the_answer_to_creating_an_api_key_documents_its_secret(schema):
    create = schema["paths"]["/api/api-keys/"]["post"]
    assert create["responses"]["201"]["content"]["application/json"]["schema"] == ref(
        "ApiKeyCreated"
    )
    components = schema["components"]["schemas"]
    assert "key" in components["ApiKeyCreated"]["properties"]
    for name in ("ApiKey", "ApiKeyCreateRequest"):
        assert not {"key", "salt", "digest"} & set(components[name]["properties"]), name


# --- what schemathesis found (tests/test_api_fuzz.py) -------------------------------------------


def test_a_blank_stop_reason_or_outcome_is_documented(schema):
    """A VM that is not stopping has stop_reason "", an open notice outcome "": the enums said
    neither could be blank."""
    components = schema["components"]["schemas"]
    for component, field in (("VirtualMachine", "stop_reason"), ("Notice", "outcome")):
        branches = components[component]["properties"][field]["oneOf"]
        assert {"$ref": "#/components/schemas/BlankEnum"} in branches, component
    assert components["BlankEnum"]["enum"] == [""]


def test_a_pool_or_image_answer_has_exactly_one_of_its_shapes(schema):
    """An operator's pool has every field of a tenant's pool: with open shapes it matched both
    branches of the oneOf, which then said it matched neither."""
    components = schema["components"]["schemas"]
    for seen, shapes in (
        ("PoolAsSeen", {"Pool", "TenantPool"}),
        ("ImageAsSeen", {"Image", "TenantImage"}),
        ("BareMetalRentalAsSeen", {"OperatorRental", "BareMetalRental"}),
        ("BareMetalImageAsSeen", {"BareMetalImage", "TenantBareMetalImage"}),
    ):
        assert {b["$ref"].rsplit("/", 1)[-1] for b in components[seen]["oneOf"]} == shapes
        for shape in shapes:
            assert components[shape]["additionalProperties"] is False, shape


def test_text_a_request_carries_documents_the_characters_refused(schema):
    """A query or body string with a control character is a 400 (gpucap.inputs); the schema
    said any string would do."""
    nodes = {p["name"]: p["schema"] for p in schema["paths"]["/api/nodes/"]["get"]["parameters"]}
    assert nodes["gpu_model"]["pattern"] == r"^[^\x00-\x08\x0b\x0c\x0e-\x1f]*$"
    assert nodes["hostname"]["pattern"] == r"^[^\x00-\x1f\u202a-\u202e\u2066-\u2069]*$"
    vm = schema["components"]["schemas"]["VmRequestRequest"]["properties"]
    assert vm["name"]["pattern"] == nodes["hostname"]["pattern"]
    assert vm["user_data"]["pattern"] == nodes["gpu_model"]["pattern"]


def test_members_and_invitations_are_documented_as_the_plain_lists_they_are(schema):
    for path in ("/api/tenants/{id}/members/", "/api/tenants/{id}/invitations/"):
        operation = schema["paths"][path]["get"]
        content = operation["responses"]["200"]["content"]["application/json"]["schema"]
        assert content["type"] == "array", path
        assert not {p["name"] for p in operation.get("parameters", [])} - {"id"}, path
    member = schema["components"]["schemas"]["Member"]["properties"]
    assert member["last_login"]["nullable"] is True


def test_the_token_endpoint_documents_its_json_body(schema):
    body = schema["paths"]["/api/token/"]["post"]["requestBody"]
    assert body["required"] is True
    assert body["content"]["application/json"]["schema"] == ref("AuthTokenRequest")


def test_request_bodies_are_documented_as_json_only(schema):
    """Form encodings cannot carry null, lists of lists or objects, which the shapes have."""
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            if "requestBody" in operation:
                assert set(operation["requestBody"]["content"]) == {"application/json"}, path


def test_request_shapes_that_refuse_unknown_fields_say_so(schema):
    """Every request body but the token's is an InputSerializer, which refuses a field it does
    not know by name (400): the shapes were documented open."""
    components = schema["components"]["schemas"]
    requests = {name: c for name, c in components.items() if name.endswith("Request")}
    open_shapes = {
        name for name, c in requests.items() if c.get("additionalProperties") is not False
    }
    assert open_shapes == {"AuthTokenRequest"}


@pytest.mark.parametrize(("command", "request_shape"), [("power", "Power"), ("reimage", "Reimage")])
def test_a_tenant_s_machine_command_is_answered_202_with_its_rental(schema, command, request_shape):
    operation = schema["paths"][f"/api/bare-metal/{{id}}/{command}/"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body == ref(f"{request_shape}Request")
    answer = operation["responses"]["202"]["content"]["application/json"]["schema"]
    assert answer == ref("BareMetalRental")
    assert not {"bmc_address", "username", "password", "bmc_error"} & set(
        schema["components"]["schemas"]["BareMetalRental"]["properties"]
    )
