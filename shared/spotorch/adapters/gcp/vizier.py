"""TrialSearch on Vertex AI Vizier (aiplatform_v1.VizierServiceClient).

The client is built on first use, one per region (one for the emulator). The study is found by
its display name (CreateStudy, and LookupStudy when it exists: a redelivered sweep finds its
study); SuggestTrials and CheckTrialEarlyStoppingState are long-running operations waited on;
a CompleteTrial refused because the trial is completed returns the trial as it is. Failures
become SearchError, transient ones retried as every Vertex call is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from spotorch.adapters.gcp.vertex_calls import (
    RetryPolicy,
    call_with_retries,
    emulator_channel,
)
from spotorch.core.sweep_spec import Goal, Parameter, ParamValue, Scale
from spotorch.ports.vizier import (
    ACTIVE,
    COMPLETED,
    STOPPING,
    Measurement,
    SearchError,
    StudyConfig,
    StudyTrial,
)

T = TypeVar("T")
OPERATION_TIMEOUT_S = 120.0  # how long to wait for SuggestTrials' operation
_ALGORITHMS = {"": 0, "GRID_SEARCH": 2, "RANDOM_SEARCH": 3}
# Trial.State: REQUESTED 1, ACTIVE 2, STOPPING 3, SUCCEEDED 4, INFEASIBLE 5
_STATES = {1: ACTIVE, 2: ACTIVE, 3: STOPPING, 4: COMPLETED, 5: COMPLETED}


def _client(endpoint: str | None, region: str, token: str | None) -> Any:
    from google.cloud import aiplatform_v1 as v1

    if endpoint:
        from google.cloud.aiplatform_v1.services.vizier_service.transports.grpc import (
            VizierServiceGrpcTransport,
        )
        return v1.VizierServiceClient(transport=VizierServiceGrpcTransport(
            channel=emulator_channel(endpoint, token)))
    return v1.VizierServiceClient(
        client_options={"api_endpoint": f"{region}-aiplatform.googleapis.com"})


def _region(name: str) -> str:
    parts = name.split("/")
    return parts[3] if len(parts) > 3 else ""


def _study_of(trial: str) -> str:
    return trial.rpartition("/trials/")[0]


def parameter_spec(param: Parameter) -> Any:
    """A sweep parameter as a StudySpec.ParameterSpec (booleans and strings are categorical)."""
    from google.cloud import aiplatform_v1 as v1

    spec = v1.StudySpec.ParameterSpec
    scale = spec.ScaleType.UNIT_LOG_SCALE if param.scale is Scale.LOG \
        else spec.ScaleType.UNIT_LINEAR_SCALE
    if param.values:
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in param.values):
            return spec(parameter_id=param.name, discrete_value_spec=spec.DiscreteValueSpec(
                values=sorted(float(v) for v in param.values)))
        return spec(parameter_id=param.name, categorical_value_spec=spec.CategoricalValueSpec(
            values=[_text(v) for v in param.values]))
    if param.low is None or param.high is None:
        raise SearchError(f"parameter {param.name}: give values, or low and high", permanent=True,
                          code="INVALID_ARGUMENT")
    if param.integer:
        return spec(parameter_id=param.name, scale_type=scale,
                    integer_value_spec=spec.IntegerValueSpec(min_value=int(param.low),
                                                             max_value=int(param.high)))
    return spec(parameter_id=param.name, scale_type=scale,
                double_value_spec=spec.DoubleValueSpec(min_value=param.low, max_value=param.high))


def _text(value: ParamValue) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _value(param: Parameter | None, raw: Any) -> ParamValue:
    """A suggested value in the sweep parameter's own type."""
    if param is None:
        return raw if isinstance(raw, str | bool) else float(raw)
    if param.values:
        for value in param.values:
            if (isinstance(raw, str) and _text(value) == raw) or (
                    not isinstance(raw, str) and not isinstance(value, str | bool)
                    and float(value) == float(raw)):
                return value
        return raw if isinstance(raw, str) else float(raw)
    return round(float(raw)) if param.integer else float(raw)


class VertexTrialSearch:
    """ports.TrialSearch on VizierService."""

    def __init__(self, project: str, *, endpoint: str | None = None,
                 retry: RetryPolicy | None = None, call_timeout_s: float = 60.0,
                 operation_timeout_s: float = OPERATION_TIMEOUT_S,
                 client_factory: Callable[[str], Any] | None = None,
                 token: str | None = None) -> None:
        self.project = project
        self.endpoint = endpoint
        self.retry = retry or RetryPolicy()
        self.call_timeout_s = call_timeout_s
        self.operation_timeout_s = operation_timeout_s
        self._make = client_factory or (lambda region: _client(endpoint, region, token))
        self._clients: dict[str, Any] = {}
        self._params: dict[str, Mapping[str, Parameter]] = {}  # study -> its parameters
        self._lock = threading.Lock()

    def _c(self, region: str) -> Any:
        key = "" if self.endpoint else region
        with self._lock:
            if key not in self._clients:
                self._clients[key] = self._make(region)
            return self._clients[key]

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        return call_with_retries(what, fn, self.retry, SearchError, timeouts=(FutureTimeout,))

    # --- conversions ---------------------------------------------------------------------------

    def _parameters(self, study: str) -> Mapping[str, Parameter]:
        """The study's parameters (GetStudy once per process when it was not made here)."""
        known = self._params.get(study)
        if known is not None:
            return known
        got = self._call(f"get study {study}", lambda: self._c(_region(study)).get_study(
            name=study, timeout=self.call_timeout_s))
        params: dict[str, Parameter] = {}
        for spec in got.study_spec.parameters:
            kind = spec._pb.WhichOneof("parameter_value_spec")
            if kind == "categorical_value_spec":
                params[spec.parameter_id] = Parameter(spec.parameter_id,
                                                      tuple(spec.categorical_value_spec.values))
            elif kind == "discrete_value_spec":
                params[spec.parameter_id] = Parameter(spec.parameter_id, tuple(
                    int(v) if float(v).is_integer() else float(v)
                    for v in spec.discrete_value_spec.values))
            else:
                params[spec.parameter_id] = Parameter(
                    spec.parameter_id, low=0.0, high=1.0,
                    integer=kind == "integer_value_spec")
        self._params[study] = params
        return params

    def _trial(self, proto: Any, params: Mapping[str, Parameter]) -> StudyTrial:
        def measurement(m: Any) -> Measurement:
            return Measurement(int(m.step_count), {str(x.metric_id): float(x.value)
                                                   for x in m.metrics})
        has_final = "final_measurement" in proto and proto.state == 4
        return StudyTrial(
            name=str(proto.name), state=_STATES.get(int(proto.state), ACTIVE),
            params={str(p.parameter_id): _value(params.get(p.parameter_id), p.value)
                    for p in proto.parameters},
            client_id=str(proto.client_id),
            measurements=tuple(measurement(m) for m in proto.measurements),
            final=measurement(proto.final_measurement).metrics if has_final else None,
            infeasible=int(proto.state) == 5, infeasible_reason=str(proto.infeasible_reason))

    # --- the port ----------------------------------------------------------------------------

    def study(self, config: StudyConfig) -> str:
        """TrialSearch.study: CreateStudy, or LookupStudy when the display name is taken."""
        from google.api_core import exceptions as api
        from google.cloud import aiplatform_v1 as v1

        parent = f"projects/{self.project}/locations/{config.region}"
        goal = v1.StudySpec.MetricSpec.GoalType
        spec = v1.StudySpec(
            metrics=[v1.StudySpec.MetricSpec(metric_id=o.name, goal=goal.MAXIMIZE
                                             if o.goal is Goal.MAXIMIZE else goal.MINIMIZE)
                     for o in config.objectives],
            parameters=[parameter_spec(p) for p in config.parameters],
            algorithm=_ALGORITHMS.get(config.algorithm, 0))
        if config.median_stopping:
            spec.median_automated_stopping_spec = v1.StudySpec.MedianAutomatedStoppingSpec()

        def find_or_create() -> str:
            client = self._c(config.region)
            try:
                made = client.create_study(parent=parent, study=v1.Study(
                    display_name=config.display_name, study_spec=spec),
                    timeout=self.call_timeout_s)
            except api.AlreadyExists:  # made by an earlier delivery of this sweep
                made = client.lookup_study(request={"parent": parent,
                                                    "display_name": config.display_name},
                                           timeout=self.call_timeout_s)
            return str(made.name)

        name = self._call(f"study {config.display_name}", find_or_create)
        self._params[name] = {p.name: p for p in config.parameters}
        return name

    def suggest(self, study: str, client_id: str, count: int = 1) -> tuple[StudyTrial, ...]:
        """TrialSearch.suggest: SuggestTrials (an operation) with the client's id."""
        params = self._parameters(study)

        def ask() -> Any:
            op = self._c(_region(study)).suggest_trials(request={
                "parent": study, "suggestion_count": count, "client_id": client_id},
                timeout=self.call_timeout_s)
            return op.result(timeout=self.operation_timeout_s)

        response = self._call(f"suggest trials of {study}", ask)
        return tuple(self._trial(t, params) for t in response.trials)

    def measure(self, trial: str, measurement: Measurement) -> bool:
        """TrialSearch.measure: AddTrialMeasurement; False when the trial is completed."""
        from google.cloud import aiplatform_v1 as v1

        request = v1.AddTrialMeasurementRequest(trial_name=trial, measurement=v1.Measurement(
            step_count=measurement.step, metrics=[v1.Measurement.Metric(metric_id=k, value=v)
                                                  for k, v in measurement.metrics.items()]))
        try:
            self._call(f"measure {trial}", lambda: self._c(_region(trial)).add_trial_measurement(
                request=request, timeout=self.call_timeout_s))
        except SearchError as exc:
            if exc.code == "FAILED_PRECONDITION":
                return False
            raise
        return True

    def complete(self, trial: str, final: Mapping[str, float] | None, *,
                 infeasible_reason: str = "") -> StudyTrial:
        """TrialSearch.complete: CompleteTrial; a completed trial is read back as it is."""
        from google.cloud import aiplatform_v1 as v1

        request = v1.CompleteTrialRequest(name=trial)
        if infeasible_reason:
            request.trial_infeasible = True
            request.infeasible_reason = infeasible_reason
        elif final is not None:
            request.final_measurement = v1.Measurement(metrics=[
                v1.Measurement.Metric(metric_id=k, value=v) for k, v in final.items()])
        params = self._parameters(_study_of(trial))
        try:
            got = self._call(f"complete {trial}", lambda: self._c(_region(trial)).complete_trial(
                request=request, timeout=self.call_timeout_s))
        except SearchError as exc:
            if exc.code != "FAILED_PRECONDITION":
                raise
            return self.trial(trial)  # completed by an earlier delivery
        return self._trial(got, params)

    def should_stop(self, trial: str) -> bool:
        """TrialSearch.should_stop: CheckTrialEarlyStoppingState (an operation)."""
        def check() -> bool:
            op = self._c(_region(trial)).check_trial_early_stopping_state(
                request={"trial_name": trial}, timeout=self.call_timeout_s)
            return bool(op.result(timeout=self.operation_timeout_s).should_stop)

        return self._call(f"check {trial}", check)

    def optimal(self, study: str) -> tuple[StudyTrial, ...]:
        """TrialSearch.optimal: ListOptimalTrials."""
        params = self._parameters(study)
        got = self._call(f"optimal trials of {study}", lambda: self._c(
            _region(study)).list_optimal_trials(request={"parent": study},
                                                timeout=self.call_timeout_s))
        return tuple(self._trial(t, params) for t in got.optimal_trials)

    def trial(self, name: str) -> StudyTrial:
        """TrialSearch.trial: GetTrial."""
        params = self._parameters(_study_of(name))
        got = self._call(f"get {name}", lambda: self._c(_region(name)).get_trial(
            name=name, timeout=self.call_timeout_s))
        return self._trial(got, params)

    def trials(self, study: str) -> tuple[StudyTrial, ...]:
        """TrialSearch.trials: ListTrials, every page."""
        params = self._parameters(study)
        got = self._call(f"trials of {study}", lambda: list(self._c(_region(study)).list_trials(
            parent=study, timeout=self.call_timeout_s)))
        return tuple(self._trial(t, params) for t in got)
