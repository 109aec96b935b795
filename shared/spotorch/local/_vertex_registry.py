"""The Vertex emulator's ModelService, MetadataService and long-running operations (in memory).

Only what spotorch calls, answered the way Vertex answers: UploadModel is a long-running
operation whose version exists once the operation is done (after `operation_s`, polled through
google.longrunning.Operations/GetOperation, as the real client does); the first version of a
model gets the `default` alias, and an alias applied to a new version leaves the version that
had it (Vertex's documented behaviour). The metadata store must be created before contexts can
be (CreateMetadataStore, also a long-running operation), as in a new project.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spotorch.local._vertex_iam import IamPolicy
from spotorch.local._vertex_jobs import Invalid, utc
from spotorch.local._vertex_service import _validate_labels, copy, parse_parent

MODEL_SERVICE = "google.cloud.aiplatform.v1.ModelService"
METADATA_SERVICE = "google.cloud.aiplatform.v1.MetadataService"
OPERATIONS_SERVICE = "google.longrunning.Operations"

_MODEL_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_ALIAS = re.compile(r"^[a-z][a-zA-Z0-9-]{0,126}[a-z0-9]$")
_CONTEXT_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")
_FILTER_TERM = re.compile(r'^(?P<field>schema_title|parent_contexts|display_name)\s*(?P<op>=|:)\s*'
                          r'"(?P<value>[^"]*)"$')


@dataclass
class _Operation:
    name: str
    ready_at: float
    finish: Callable[[], Any]  # makes the resource; returns the response message (proto-plus)
    metadata: Any
    response: Any = None
    error: Invalid | None = None


@dataclass
class RegistryState:
    models: dict[str, list[Any]] = field(default_factory=dict)  # model name -> versions (Model)
    stores: set[str] = field(default_factory=set)
    contexts: dict[str, Any] = field(default_factory=dict)
    operations: dict[str, _Operation] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)


def _pack(message: Any) -> Any:
    from google.protobuf import any_pb2

    packed = any_pb2.Any()
    packed.Pack(type(message).pb(message))
    return packed


class RegistryServices:
    """ModelService (UploadModel, GetModel, ListModelVersions), MetadataService (the store and
    contexts) and Operations (GetOperation) over one in-memory state."""

    def __init__(self, project: str | None, *, operation_s: float = 0.3,
                 clock: Callable[[], float] = time.monotonic,
                 iam: IamPolicy | None = None) -> None:
        self.project = project
        self.iam = iam  # None: callers are not checked
        self.operation_s = operation_s
        self.state = RegistryState()
        self._clock = clock
        self._ids = itertools.count(time.time_ns() // 1000)

    # --- helpers ---------------------------------------------------------------------------------

    def _check_project(self, parent: str) -> tuple[str, str]:
        project, region = parse_parent(parent)
        if self.project is not None and project != self.project:
            raise Invalid("PERMISSION_DENIED", f"project {project!r} is not served by this "
                          f"emulator (it serves {self.project!r})")
        return project, region

    def _settle(self) -> None:
        """Finish every operation whose time has come (under the lock)."""
        now = self._clock()
        for op in self.state.operations.values():
            if op.response is None and op.error is None and now >= op.ready_at:
                try:
                    op.response = op.finish()
                except Invalid as exc:
                    op.error = exc

    def _operation(self, prefix: str, finish: Callable[[], Any], metadata: Any) -> Any:
        name = f"{prefix}/operations/{next(self._ids)}"
        op = _Operation(name, self._clock() + self.operation_s, finish, metadata)
        self.state.operations[name] = op
        self._settle()
        return self._proto(op)

    def start_operation(self, prefix: str, finish: Callable[[], Any], metadata: Any) -> Any:
        """A long-running operation of another service (VizierService), done after operation_s."""
        with self.state.lock:
            return self._operation(prefix, finish, metadata)

    def _proto(self, op: _Operation) -> Any:
        from google.longrunning import operations_pb2
        from google.rpc import status_pb2

        proto = operations_pb2.Operation(name=op.name, metadata=_pack(op.metadata))
        if op.error is not None:
            import grpc

            proto.done = True
            proto.error.CopyFrom(status_pb2.Status(
                code=getattr(grpc.StatusCode, op.error.code).value[0], message=str(op.error)))
        elif op.response is not None:
            proto.done = True
            proto.response.CopyFrom(_pack(op.response))
        return proto

    # --- Operations ---------------------------------------------------------------------------

    def get_operation(self, request: Any) -> Any:
        with self.state.lock:
            self._settle()
            op = self.state.operations.get(request.name)
            if op is None:
                raise Invalid("NOT_FOUND", f"operation {request.name} not found")
            return self._proto(op)

    # --- ModelService -----------------------------------------------------------------------------

    def upload_model(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        _, region = self._check_project(request.parent)
        model = request.model
        if not model.display_name:
            raise Invalid("INVALID_ARGUMENT", "model.display_name is required")
        if not model.container_spec.image_uri:
            raise Invalid("INVALID_ARGUMENT", "model.container_spec.image_uri is required for a "
                          "custom-trained model")
        _validate_labels(model.labels)
        for alias in model.version_aliases:
            if not _ALIAS.match(alias) or alias == "default":
                raise Invalid("INVALID_ARGUMENT", f"invalid version alias {alias!r}")
        with self.state.lock:
            self._settle()
            if request.parent_model:
                if request.model_id:
                    raise Invalid("INVALID_ARGUMENT", "give parent_model or model_id, not both")
                name = request.parent_model
                if name not in self.state.models:
                    raise Invalid("NOT_FOUND", f"parent model {name} not found")
                if not name.startswith(f"{request.parent}/models/"):
                    raise Invalid("INVALID_ARGUMENT", "parent_model is not under parent")
            else:
                mid = request.model_id or str(next(self._ids))
                if not _MODEL_ID.match(mid):
                    raise Invalid("INVALID_ARGUMENT", f"invalid model_id {mid!r}")
                name = f"{request.parent}/models/{mid}"
                if name in self.state.models:
                    raise Invalid("ALREADY_EXISTS", f"model {name} already exists")
                self.state.models[name] = []  # the id is taken from now on
            proto = copy(model)

            def finish() -> Any:
                versions = self.state.models[name]
                now = utc(time.time())
                proto.name = name
                proto.version_id = str(len(versions) + 1)
                aliases = list(dict.fromkeys(
                    (["default"] if not versions else []) + list(proto.version_aliases)))
                for other in versions:  # an alias names one version: it leaves the others
                    kept = [a for a in other.version_aliases if a not in aliases]
                    del other.version_aliases[:]
                    other.version_aliases.extend(kept)
                del proto.version_aliases[:]
                proto.version_aliases.extend(aliases)
                proto.create_time = proto.update_time = now
                proto.version_create_time = proto.version_update_time = now
                versions.append(proto)
                return v1.UploadModelResponse(model=name, model_version_id=proto.version_id)

            metadata = v1.UploadModelOperationMetadata(
                generic_metadata=v1.GenericOperationMetadata(create_time=utc(time.time())))
            del region
            return self._operation(name, finish, metadata)

    def _version(self, name: str) -> Any:
        model, _, wanted = name.partition("@")
        versions = self.state.models.get(model) or []
        if not versions:
            raise Invalid("NOT_FOUND", f"model {model} not found")
        if not wanted or wanted == "default":
            wanted = "default"
        for version in versions:
            if version.version_id == wanted or wanted in version.version_aliases:
                return version
        raise Invalid("NOT_FOUND", f"model version {name} not found")

    def get_model(self, request: Any) -> Any:
        with self.state.lock:
            self._settle()
            return copy(self._version(request.name))

    def merge_version_aliases(self, request: Any) -> Any:
        """MergeVersionAliases: `alias` adds (moving it from the version holding it), `-alias`
        removes; the name must carry a version id. Removing `default` is refused (Vertex moves
        it only by giving it to another version; its exact error is not documented)."""
        model, at, wanted = request.name.partition("@")
        if not at or not wanted:
            raise Invalid("INVALID_ARGUMENT", f"{request.name}: the version id must be given")
        if not request.version_aliases:
            raise Invalid("INVALID_ARGUMENT", "version_aliases must not be empty")
        adds: list[str] = []
        removes: list[str] = []
        for alias in request.version_aliases:
            bare = alias[1:] if alias.startswith("-") else alias
            if not _ALIAS.match(bare):
                raise Invalid("INVALID_ARGUMENT", f"invalid version alias {alias!r}")
            (removes if alias.startswith("-") else adds).append(bare)
        if "default" in removes:
            raise Invalid("INVALID_ARGUMENT", "the default alias cannot be removed")
        with self.state.lock:
            self._settle()
            version = self._version(request.name)
            if version.version_id != wanted:
                raise Invalid("INVALID_ARGUMENT", f"{request.name}: name a version id, not an "
                                                  "alias")
            for other in self.state.models.get(model) or []:
                if other is version:
                    continue
                kept = [a for a in other.version_aliases if a not in adds]
                del other.version_aliases[:]
                other.version_aliases.extend(kept)
            mine = [a for a in dict.fromkeys((*version.version_aliases, *adds))
                    if a not in removes]
            del version.version_aliases[:]
            version.version_aliases.extend(mine)
            version.version_update_time = utc(time.time())
            return copy(version)

    def list_model_versions(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        from spotorch.local._vertex_filter import FilterError, matches, parse_filter

        try:
            terms = parse_filter(request.filter)
        except FilterError as exc:
            raise Invalid("INVALID_ARGUMENT", str(exc)) from exc
        with self.state.lock:
            self._settle()
            versions = self.state.models.get(request.name)
            if not versions:
                raise Invalid("NOT_FOUND", f"model {request.name} not found")
            found = [copy(v) for v in versions
                     if matches(terms, v.labels, v.display_name, "")]
        return v1.ListModelVersionsResponse(models=found)

    # --- MetadataService ----------------------------------------------------------------------

    def get_metadata_store(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        with self.state.lock:
            self._settle()
            if request.name not in self.state.stores:
                raise Invalid("NOT_FOUND", f"metadata store {request.name} not found")
            return v1.MetadataStore(name=request.name)

    def create_metadata_store(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        self._check_project(request.parent)
        name = f"{request.parent}/metadataStores/{request.metadata_store_id or 'default'}"
        with self.state.lock:
            self._settle()
            if name in self.state.stores:
                raise Invalid("ALREADY_EXISTS", f"metadata store {name} already exists")

            def finish() -> Any:
                self.state.stores.add(name)
                return v1.MetadataStore(name=name, create_time=utc(time.time()))

            metadata = v1.CreateMetadataStoreOperationMetadata(
                generic_metadata=v1.GenericOperationMetadata(create_time=utc(time.time())))
            return self._operation(name, finish, metadata)

    def _store_of(self, parent: str) -> None:
        if parent not in self.state.stores:
            raise Invalid("NOT_FOUND", f"metadata store {parent} not found")

    def create_context(self, request: Any) -> Any:
        with self.state.lock:
            self._settle()
            self._store_of(request.parent)
            cid = request.context_id or str(next(self._ids))
            if not _CONTEXT_ID.match(cid):
                raise Invalid("INVALID_ARGUMENT", f"invalid context_id {cid!r}")
            name = f"{request.parent}/contexts/{cid}"
            if name in self.state.contexts:
                raise Invalid("ALREADY_EXISTS", f"context {name} already exists")
            proto = copy(request.context)
            proto.name = name
            del proto.parent_contexts[:]
            proto.create_time = proto.update_time = utc(time.time())
            self.state.contexts[name] = proto
            return copy(proto)

    def get_context(self, request: Any) -> Any:
        with self.state.lock:
            context = self.state.contexts.get(request.name)
            if context is None:
                raise Invalid("NOT_FOUND", f"context {request.name} not found")
            return copy(context)

    def update_context(self, request: Any) -> Any:
        with self.state.lock:
            context = self.state.contexts.get(request.context.name)
            if context is None:
                raise Invalid("NOT_FOUND", f"context {request.context.name} not found")
            update = request.context
            if update.display_name:
                context.display_name = update.display_name
            for key, value in dict(update.metadata).items():  # metadata merges key by key
                context.metadata[key] = value
            context.update_time = utc(time.time())
            return copy(context)

    def add_context_children(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        with self.state.lock:
            parent = self.state.contexts.get(request.context)
            if parent is None:
                raise Invalid("NOT_FOUND", f"context {request.context} not found")
            for child_name in request.child_contexts:
                child = self.state.contexts.get(child_name)
                if child is None:
                    raise Invalid("NOT_FOUND", f"context {child_name} not found")
                if request.context not in child.parent_contexts:
                    child.parent_contexts.append(request.context)
            return v1.AddContextChildrenResponse()

    def list_contexts(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        terms = []
        for part in re.split(r"\s+AND\s+", request.filter.strip()) if request.filter.strip() else []:
            found = _FILTER_TERM.match(part.strip())
            if not found:
                raise Invalid("INVALID_ARGUMENT", f"unsupported filter term {part!r} (the "
                              'emulator supports schema_title="T", display_name="N" and '
                              'parent_contexts:"NAME", joined by AND)')
            terms.append((found["field"], found["value"]))

        def passes(context: Any) -> bool:
            return all(value in context.parent_contexts if fld == "parent_contexts"
                       else getattr(context, fld) == value for fld, value in terms)

        with self.state.lock:
            prefix = f"{request.parent}/contexts/"
            listed = [copy(c) for n, c in self.state.contexts.items()
                      if n.startswith(prefix) and passes(c)]
        return v1.ListContextsResponse(contexts=listed)

    # --- gRPC ---------------------------------------------------------------------------------

    def handlers(self) -> tuple[Any, ...]:
        import grpc
        from google.cloud import aiplatform_v1 as v1
        from google.longrunning import operations_pb2

        def rpc(fn: Callable[[Any], Any], request_type: Any, serialize: Any,
                method: str) -> Any:
            def handle(request: Any, context: Any) -> Any:
                try:
                    if self.iam is not None:
                        self.iam.check(method, context.invocation_metadata(), request)
                    return fn(request)
                except Invalid as exc:
                    context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
            return grpc.unary_unary_rpc_method_handler(
                handle, request_deserializer=request_type.deserialize,
                response_serializer=serialize)

        def op_out(message: Any) -> bytes:
            return bytes(message.SerializeToString())

        def service(name: str, methods: dict[str, tuple[Callable[[Any], Any], Any, Any]]) -> Any:
            short = name.rsplit(".", 1)[1]
            return grpc.method_handlers_generic_handler(name, {
                method: rpc(fn, request_type, out, f"{short}/{method}")
                for method, (fn, request_type, out) in methods.items()})

        models = service(MODEL_SERVICE, {
            "UploadModel": (self.upload_model, v1.UploadModelRequest, op_out),
            "GetModel": (self.get_model, v1.GetModelRequest, v1.Model.serialize),
            "MergeVersionAliases": (self.merge_version_aliases, v1.MergeVersionAliasesRequest,
                                    v1.Model.serialize),
            "ListModelVersions": (self.list_model_versions, v1.ListModelVersionsRequest,
                                  v1.ListModelVersionsResponse.serialize),
        })
        metadata = service(METADATA_SERVICE, {
            "GetMetadataStore": (self.get_metadata_store, v1.GetMetadataStoreRequest,
                                 v1.MetadataStore.serialize),
            "CreateMetadataStore": (self.create_metadata_store, v1.CreateMetadataStoreRequest,
                                    op_out),
            "CreateContext": (self.create_context, v1.CreateContextRequest, v1.Context.serialize),
            "GetContext": (self.get_context, v1.GetContextRequest, v1.Context.serialize),
            "UpdateContext": (self.update_context, v1.UpdateContextRequest, v1.Context.serialize),
            "AddContextChildren": (self.add_context_children, v1.AddContextChildrenRequest,
                                   v1.AddContextChildrenResponse.serialize),
            "ListContexts": (self.list_contexts, v1.ListContextsRequest,
                             v1.ListContextsResponse.serialize),
        })
        operations = grpc.method_handlers_generic_handler(OPERATIONS_SERVICE, {
            "GetOperation": grpc.unary_unary_rpc_method_handler(
                lambda request, context: self._op_rpc(request, context),
                request_deserializer=operations_pb2.GetOperationRequest.FromString,
                response_serializer=op_out),
        })
        return models, metadata, operations

    def _op_rpc(self, request: Any, context: Any) -> Any:
        import grpc

        try:
            if self.iam is not None:
                self.iam.check("Operations/GetOperation", context.invocation_metadata(), request)
            return self.get_operation(request)
        except Invalid as exc:
            context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
