"""Preprocess steps on a project without a `default` VPC (issue 40): the network and subnetwork
(the pipeline's, else the deployment's) reach the Flex Template launch, and a job or launch that
fails for want of its network says what to set, and is not relaunched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spotorch.adapters.gcp.dataflow import DataflowStepLauncher
from spotorch.core import preprocess as pp
from spotorch.core.model import FailureClass
from spotorch.ports.steps import StepLaunch
from test_preprocess import load, problems

# Dataflow's words for a project without the network a job names (as users report them).
MISSING = ("Workflow failed. Causes: Network default is not accessible to Dataflow Service "
           "account or does not exist")


def test_a_missing_network_is_explained_and_not_relaunched() -> None:
    text = pp.explain(MISSING)
    assert text.startswith(pp.NETWORK_HINT) and MISSING in text
    assert "dataflow_network" in text and "preprocess.network" in text
    assert pp.explain(text) == text  # explained once
    assert pp.classify(pp.JOB_STATE_FAILED, MISSING) is FailureClass.USER_ERROR
    subnet = "Invalid value for field 'subnetwork': regions/us-east1/subnetworks/x was not found"
    assert pp.explain(subnet).startswith(pp.NETWORK_HINT)
    # other failures keep their text and class
    assert pp.explain("Traceback (most recent call last): ValueError: x") == \
        "Traceback (most recent call last): ValueError: x"
    assert pp.classify(pp.JOB_STATE_FAILED, "Quota exceeded for CPUS") is FailureClass.QUOTA


def test_a_step_names_its_network_and_subnetwork(tmp_path: Path) -> None:
    pipeline = load(tmp_path, """\
        preprocess:
          python_module: trainer.preprocess
          output_uri: gs://prep-out/prep
          network: ml-vpc
          subnetwork: regions/us-central1/subnetworks/ml-sub
        """)
    step = pipeline.preprocess
    assert step is not None and (step.network, step.subnetwork) == \
        ("ml-vpc", "regions/us-central1/subnetworks/ml-sub")
    found = problems(tmp_path, """\
        preprocess:
          python_module: trainer.preprocess
          output_uri: gs://prep-out/prep
          network: "Not A Network"
          subnetwork: ml-sub
        """)
    assert "VPC network" in found["preprocess.network"]
    assert "regions/REGION/subnetworks/NAME" in found["preprocess.subnetwork"]


class _Jobs:
    def list_jobs(self, request: Any) -> list[Any]:
        return []


class _Flex:
    def __init__(self) -> None:
        self.requests: list[Any] = []

    def launch_flex_template(self, request: Any) -> Any:
        from google.cloud import dataflow_v1beta3 as df

        self.requests.append(request)
        return df.LaunchFlexTemplateResponse(job=df.Job(id="j1", name="n"))


def _launched(steps: DataflowStepLauncher, **step: Any) -> Any:
    flex = _Flex()
    steps._clients = {"jobs": _Jobs(), "flex": flex}
    steps.launch(StepLaunch(job_name="n", region="europe-west4", input_uri="gs://a/in/",
                            output_uri="gs://a/out/", temp_uri="gs://a/tmp/",
                            machine_type="n1-standard-1", max_workers=1,
                            template_uri="gs://t/spec.json", **step))
    return flex.requests[0].launch_parameter.environment


@pytest.mark.parametrize(("deployment", "step", "expected"), [
    ({}, {}, ("", "")),  # Dataflow's default network
    ({"network": "ml-vpc", "subnetwork": "regions/europe-west4/subnetworks/s"}, {},
     ("ml-vpc", "regions/europe-west4/subnetworks/s")),
    ({"network": "ml-vpc"}, {"network": "other", "subnetwork": "regions/europe-west4/subnetworks/o"},
     ("other", "regions/europe-west4/subnetworks/o")),
])
def test_the_launch_carries_the_network(deployment: dict[str, str], step: dict[str, str],
                                        expected: tuple[str, str]) -> None:
    environment = _launched(DataflowStepLauncher("p", **deployment), **step)
    assert (environment.network, environment.subnetwork) == expected
