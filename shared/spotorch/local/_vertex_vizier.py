"""The Vertex emulator's VizierService: studies and trials in memory, suggestions from Optuna.

What spotorch calls, answered as Vertex documents it: CreateStudy (ALREADY_EXISTS for a display
name taken in the location, as the Vertex SDK's create_or_load expects), LookupStudy, GetStudy,
SuggestTrials as a long-running operation (polled through google.longrunning.Operations) whose
client_id returns that client's trials still pending before new ones are made,
AddTrialMeasurement, CompleteTrial (final_measurement, or trial_infeasible with its reason; a
completed trial is FAILED_PRECONDITION), CheckTrialEarlyStoppingState (a long-running operation;
the median rule when the study spec asks for it), ListOptimalTrials, GetTrial and ListTrials.
The suggestions come from spotorch.adapters.memory.vizier.StudyBook (Optuna's TPE), not from
Google's GP-bandit: docs/vertex-emulator.md.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from spotorch.adapters.memory.vizier import BookTrial, StudyBook, StudyStateError
from spotorch.core.pareto import Objective
from spotorch.core.sweep_spec import Goal, Parameter, Scale
from spotorch.local._vertex_iam import IamPolicy
from spotorch.local._vertex_jobs import Invalid, utc
from spotorch.local._vertex_service import parse_parent
from spotorch.ports.vizier import COMPLETED, Measurement, StudyConfig

VIZIER_SERVICE = "google.cloud.aiplatform.v1.VizierService"
MAX_DISPLAY_NAME = 128
MAX_SUGGESTIONS = 100  # suggestion_count per request (the emulator's limit; Vertex's is unstated)
_TRIAL = re.compile(r"^(?P<study>projects/[^/]+/locations/[^/]+/studies/[^/]+)/trials/(?P<id>\d+)$")
_ALGORITHMS = {0: "", 2: "GRID_SEARCH", 3: "RANDOM_SEARCH"}


class VizierService:
    """The VizierService RPCs over StudyBooks; long-running operations go through `operations`
    (the registry's, so one google.longrunning.Operations serves them all)."""

    def __init__(self, project: str | None, operations: Any, *, seed: int | None = None,
                 iam: IamPolicy | None = None) -> None:
        self.project = project
        self.iam = iam
        self.seed = seed
        self.studies: dict[str, tuple[Any, StudyBook]] = {}  # name -> (Study proto, book)
        self._ops = operations
        self._ids = itertools.count(1)
        self._lock = threading.RLock()

    # --- helpers ---------------------------------------------------------------------------------

    def _parent(self, parent: str) -> str:
        project, _ = parse_parent(parent)
        if self.project is not None and project != self.project:
            raise Invalid("PERMISSION_DENIED", f"project {project!r} is not served by this "
                          f"emulator (it serves {self.project!r})")
        return parent

    def _book(self, name: str) -> StudyBook:
        found = self.studies.get(name)
        if found is None:
            raise Invalid("NOT_FOUND", f"study {name} not found")
        return found[1]

    def _trial(self, name: str) -> tuple[StudyBook, BookTrial]:
        match = _TRIAL.match(name)
        if not match:
            raise Invalid("INVALID_ARGUMENT", f"invalid trial name {name!r}: expected "
                          "projects/P/locations/L/studies/S/trials/T")
        book = self._book(match["study"])
        try:
            return book, book.trial(int(match["id"]))
        except KeyError:
            raise Invalid("NOT_FOUND", f"trial {name} not found") from None

    # --- StudySpec -> the book's config ------------------------------------------------------------

    @staticmethod
    def _config(study: Any, region: str) -> StudyConfig:
        spec = study.study_spec
        if not study.display_name:
            raise Invalid("INVALID_ARGUMENT", "study.display_name is required")
        if len(study.display_name) > MAX_DISPLAY_NAME:
            raise Invalid("INVALID_ARGUMENT", f"study.display_name is longer than "
                          f"{MAX_DISPLAY_NAME} characters")
        if not spec.metrics:
            raise Invalid("INVALID_ARGUMENT", "study_spec.metrics: at least one metric is required")
        if not spec.parameters:
            raise Invalid("INVALID_ARGUMENT", "study_spec.parameters: at least one parameter is "
                          "required")
        goals = {1: Goal.MAXIMIZE, 2: Goal.MINIMIZE}
        objectives = []
        for metric in spec.metrics:
            if not metric.metric_id or int(metric.goal) not in goals:
                raise Invalid("INVALID_ARGUMENT", f"metric {metric.metric_id!r}: metric_id and a "
                              "goal (MAXIMIZE or MINIMIZE) are required")
            objectives.append(Objective(metric.metric_id, goals[int(metric.goal)]))
        if len({o.name for o in objectives}) != len(objectives):
            raise Invalid("INVALID_ARGUMENT", "study_spec.metrics: metric ids must be unique")
        algorithm = _ALGORITHMS.get(int(spec.algorithm))
        if algorithm is None:
            raise Invalid("INVALID_ARGUMENT", f"unsupported algorithm {spec.algorithm}")
        params = tuple(_parameter(p) for p in spec.parameters)
        if len({p.name for p in params}) != len(params):
            raise Invalid("INVALID_ARGUMENT", "study_spec.parameters: parameter ids must be unique")
        return StudyConfig(display_name=study.display_name, region=region, parameters=params,
                           objectives=tuple(objectives), algorithm=algorithm,
                           median_stopping="median_automated_stopping_spec" in spec)

    # --- the RPCs ------------------------------------------------------------------------------------

    def create_study(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        parent = self._parent(request.parent)
        _, region = parse_parent(parent)
        config = self._config(request.study, region)
        with self._lock:
            for proto, _ in self.studies.values():
                if proto.name.startswith(f"{parent}/") and proto.display_name == config.display_name:
                    raise Invalid("ALREADY_EXISTS", f"a study named {config.display_name!r} "
                                  f"already exists in {parent}: {proto.name}")
            name = f"{parent}/studies/{next(self._ids)}"
            try:
                book = StudyBook(name, config, self.seed)
            except ValueError as exc:
                raise Invalid("INVALID_ARGUMENT", str(exc)) from exc
            proto = v1.Study(name=name, display_name=config.display_name,
                             study_spec=request.study.study_spec, state=v1.Study.State.ACTIVE,
                             create_time=utc(time.time()))
            self.studies[name] = (proto, book)
            return v1.Study.deserialize(v1.Study.serialize(proto))

    def lookup_study(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        parent = self._parent(request.parent)
        if not request.display_name:
            raise Invalid("INVALID_ARGUMENT", "display_name is required")
        with self._lock:
            for proto, _ in self.studies.values():
                if proto.name.startswith(f"{parent}/") and proto.display_name == request.display_name:
                    return v1.Study.deserialize(v1.Study.serialize(proto))
        raise Invalid("NOT_FOUND", f"no study named {request.display_name!r} in {parent}")

    def get_study(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        with self._lock:
            found = self.studies.get(request.name)
            if found is None:
                raise Invalid("NOT_FOUND", f"study {request.name} not found")
            return v1.Study.deserialize(v1.Study.serialize(found[0]))

    def suggest_trials(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        if not request.client_id:
            raise Invalid("INVALID_ARGUMENT", "client_id is required")
        if not 0 < request.suggestion_count <= MAX_SUGGESTIONS:
            raise Invalid("INVALID_ARGUMENT", f"suggestion_count must be between 1 and "
                          f"{MAX_SUGGESTIONS}")
        with self._lock:
            book = self._book(request.parent)
        started = utc(time.time())
        client_id, count = str(request.client_id), int(request.suggestion_count)

        def finish() -> Any:  # the suggestions are made when the operation completes
            with self._lock:
                made = book.suggest(client_id, count)
                return v1.SuggestTrialsResponse(
                    trials=[_trial_proto(book, t) for t in made], start_time=started,
                    end_time=utc(time.time()),
                    study_state=v1.Study.State.ACTIVE if made else v1.Study.State.COMPLETED)

        metadata = v1.SuggestTrialsMetadata(
            generic_metadata=v1.GenericOperationMetadata(create_time=started), client_id=client_id)
        return self._ops.start_operation(request.parent, finish, metadata)

    def add_trial_measurement(self, request: Any) -> Any:
        with self._lock:
            book, trial = self._trial(request.trial_name)
            try:
                book.measure(trial.id, _measurement(request.measurement))
            except StudyStateError as exc:
                raise Invalid("FAILED_PRECONDITION", str(exc)) from exc
            return _trial_proto(book, trial)

    def complete_trial(self, request: Any) -> Any:
        with self._lock:
            book, trial = self._trial(request.name)
            infeasible = bool(request.trial_infeasible)
            if request.infeasible_reason and not infeasible:
                raise Invalid("INVALID_ARGUMENT", "infeasible_reason is set but trial_infeasible "
                              "is false")
            final = (dict(_measurement(request.final_measurement).metrics)
                     if "final_measurement" in request else None)
            try:
                book.complete(trial.id, final, infeasible=infeasible,
                              reason=str(request.infeasible_reason))
            except StudyStateError as exc:
                raise Invalid("FAILED_PRECONDITION", str(exc)) from exc
            return _trial_proto(book, trial)

    def check_trial_early_stopping_state(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        with self._lock:
            book, trial = self._trial(request.trial_name)
        match = _TRIAL.match(request.trial_name)
        assert match is not None

        def finish() -> Any:
            with self._lock:
                stop = book.should_stop(trial.id)
                if stop:
                    trial.state = "STOPPING"
                return v1.CheckTrialEarlyStoppingStateResponse(should_stop=stop)

        metadata = v1.CheckTrialEarlyStoppingStateMetatdata(
            generic_metadata=v1.GenericOperationMetadata(create_time=utc(time.time())),
            study=match["study"], trial=str(trial.id))
        return self._ops.start_operation(match["study"], finish, metadata)

    def list_optimal_trials(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        with self._lock:
            book = self._book(request.parent)
            return v1.ListOptimalTrialsResponse(
                optimal_trials=[_trial_proto(book, t) for t in book.optimal()])

    def get_trial(self, request: Any) -> Any:
        with self._lock:
            book, trial = self._trial(request.name)
            return _trial_proto(book, trial)

    def list_trials(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        with self._lock:
            book = self._book(request.parent)
            return v1.ListTrialsResponse(trials=[_trial_proto(book, t) for t in book.trials])

    # --- gRPC ---------------------------------------------------------------------------------

    def handlers(self) -> Any:
        import grpc
        from google.cloud import aiplatform_v1 as v1

        def op_out(message: Any) -> bytes:
            return bytes(message.SerializeToString())

        table: dict[str, tuple[Callable[[Any], Any], Any, Any]] = {
            "CreateStudy": (self.create_study, v1.CreateStudyRequest, v1.Study.serialize),
            "LookupStudy": (self.lookup_study, v1.LookupStudyRequest, v1.Study.serialize),
            "GetStudy": (self.get_study, v1.GetStudyRequest, v1.Study.serialize),
            "SuggestTrials": (self.suggest_trials, v1.SuggestTrialsRequest, op_out),
            "AddTrialMeasurement": (self.add_trial_measurement, v1.AddTrialMeasurementRequest,
                                    v1.Trial.serialize),
            "CompleteTrial": (self.complete_trial, v1.CompleteTrialRequest, v1.Trial.serialize),
            "CheckTrialEarlyStoppingState": (self.check_trial_early_stopping_state,
                                             v1.CheckTrialEarlyStoppingStateRequest, op_out),
            "ListOptimalTrials": (self.list_optimal_trials, v1.ListOptimalTrialsRequest,
                                  v1.ListOptimalTrialsResponse.serialize),
            "GetTrial": (self.get_trial, v1.GetTrialRequest, v1.Trial.serialize),
            "ListTrials": (self.list_trials, v1.ListTrialsRequest, v1.ListTrialsResponse.serialize),
        }

        def rpc(method: str, fn: Callable[[Any], Any], request_type: Any, out: Any) -> Any:
            def handle(request: Any, context: Any) -> Any:
                try:
                    if self.iam is not None:
                        self.iam.check(f"VizierService/{method}", context.invocation_metadata(),
                                       request)
                    return fn(request)
                except Invalid as exc:
                    context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
            return grpc.unary_unary_rpc_method_handler(
                handle, request_deserializer=request_type.deserialize, response_serializer=out)

        return grpc.method_handlers_generic_handler(VIZIER_SERVICE, {
            method: rpc(method, fn, request_type, out)
            for method, (fn, request_type, out) in table.items()})


def _parameter(spec: Any) -> Parameter:
    """A StudySpec.ParameterSpec as a sweep parameter (the book's vocabulary)."""
    pid = str(spec.parameter_id)
    if not pid:
        raise Invalid("INVALID_ARGUMENT", "parameter_id is required")
    scale = Scale.LOG if int(spec.scale_type) == 2 else Scale.LINEAR  # UNIT_LOG_SCALE
    kind = spec._pb.WhichOneof("parameter_value_spec")
    if kind == "double_value_spec":
        low, high = spec.double_value_spec.min_value, spec.double_value_spec.max_value
        integer = False
    elif kind == "integer_value_spec":
        low, high = spec.integer_value_spec.min_value, spec.integer_value_spec.max_value
        integer = True
    elif kind == "categorical_value_spec":
        values = tuple(str(v) for v in spec.categorical_value_spec.values)
        if not values:
            raise Invalid("INVALID_ARGUMENT", f"parameter {pid}: categorical values are empty")
        return Parameter(name=pid, values=values)
    elif kind == "discrete_value_spec":
        numbers = tuple(float(v) for v in spec.discrete_value_spec.values)
        if not numbers or len(set(numbers)) != len(numbers):
            raise Invalid("INVALID_ARGUMENT", f"parameter {pid}: discrete values must be given "
                          "once each")
        return Parameter(name=pid, values=numbers)
    else:
        raise Invalid("INVALID_ARGUMENT", f"parameter {pid}: a value spec is required")
    if not low < high:
        raise Invalid("INVALID_ARGUMENT", f"parameter {pid}: min_value must be below max_value")
    if scale is Scale.LOG and low <= 0:
        raise Invalid("INVALID_ARGUMENT", f"parameter {pid}: UNIT_LOG_SCALE needs min_value > 0")
    return Parameter(name=pid, low=float(low), high=float(high), scale=scale, integer=integer)


def _measurement(proto: Any) -> Measurement:
    return Measurement(step=int(proto.step_count),
                       metrics={str(m.metric_id): float(m.value) for m in proto.metrics})


def _measurement_proto(m: Measurement) -> Any:
    from google.cloud import aiplatform_v1 as v1

    return v1.Measurement(step_count=m.step, metrics=[
        v1.Measurement.Metric(metric_id=k, value=v) for k, v in m.metrics.items()])


def _trial_proto(book: StudyBook, trial: BookTrial) -> Any:
    from google.cloud import aiplatform_v1 as v1

    state = (v1.Trial.State.ACTIVE if trial.state != COMPLETED
             else v1.Trial.State.INFEASIBLE if trial.infeasible else v1.Trial.State.SUCCEEDED)
    if trial.state == "STOPPING":
        state = v1.Trial.State.STOPPING
    proto = v1.Trial(name=f"{book.name}/trials/{trial.id}", id=str(trial.id), state=state,
                     client_id=trial.client_id, infeasible_reason=trial.infeasible_reason,
                     parameters=[v1.Trial.Parameter(parameter_id=k, value=v)
                                 for k, v in trial.params.items()],
                     measurements=[_measurement_proto(m) for m in trial.measurements])
    if trial.final is not None:
        proto.final_measurement = _measurement_proto(Measurement(
            trial.measurements[-1].step if trial.measurements else 0, trial.final))
    return proto
