#!/usr/bin/env bash
# spotorch deployment: package the functions, then plan / apply / destroy deploy/*.tf.
#
#   deploy/deploy.sh package|plan|apply|destroy
#
# Settings (environment):
#   PIPELINES     directory of pipeline YAML to ship (required for package, plan and apply; never
#                 the examples, whose buckets, accounts and secrets are not yours)
#   TFVARS        Terraform variables file (default: deploy/terraform.tfvars; see terraform.tfvars.example)
#   SPOTORCH_PRICES  a price table (spotorch prices refresh): the bundle carries it, the functions use it
#   PROJECT       project id; overrides project_id from TFVARS (optional)
#   REGION        region; overrides region from TFVARS (optional)
#   PYTHON        Python with spotorch's dependencies (default: .venv/bin/python)
#   AUTO_APPROVE  set to 1 to apply/destroy without the confirmation prompt
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
PIPELINES="${PIPELINES:-}"
TFVARS="${TFVARS:-$HERE/terraform.tfvars}"
BUILD="$HERE/build"
BUNDLE="$BUILD/spotorch-functions.zip"
BUCKETS="$BUILD/pipelines.tfvars.json"

die() { echo "deploy: $*" >&2; exit 1; }

package() {
  [[ -n "$PIPELINES" ]] || die "set PIPELINES to the directory of your pipelines (spotorch init DIR writes one)"
  [[ -d "$PIPELINES" ]] || die "PIPELINES=$PIPELINES is not a directory"
  if [[ "$(realpath "$PIPELINES")" == "$(realpath "$ROOT/examples/pipelines")" ]]; then
    die "PIPELINES is the examples: their buckets (acme-ml-*), accounts and secrets are not yours; use your own (spotorch init DIR)"
  fi
  local prices=()
  if [[ -n "${SPOTORCH_PRICES:-}" ]]; then prices=(--prices "$SPOTORCH_PRICES"); fi
  "$PYTHON" "$HERE/package.py" --root "$ROOT" --pipelines "$PIPELINES" --out "$BUNDLE" --tfvars "$BUCKETS" "${prices[@]}"
}

tf() { terraform -chdir="$HERE" "$@"; }

run() {
  local cmd="$1" args=()
  command -v terraform >/dev/null || die "terraform is not installed (https://developer.hashicorp.com/terraform/install)"
  if [[ -f "$TFVARS" ]]; then
    if grep -n '^[^#]*replace-me' "$TFVARS" >&2; then
      die "fill in the placeholders (replace-me) of $TFVARS first"
    fi
    args+=("-var-file=$(realpath "$TFVARS")")
  elif [[ -z "${PROJECT:-}" ]]; then
    die "no $TFVARS and no PROJECT: copy deploy/terraform.tfvars.example to deploy/terraform.tfvars"
  fi
  if [[ -f "$BUCKETS" ]]; then args+=("-var-file=$BUCKETS"); fi
  if [[ -n "${PROJECT:-}" ]]; then args+=("-var=project_id=$PROJECT"); fi
  if [[ -n "${REGION:-}" ]]; then args+=("-var=region=$REGION"); fi
  args+=("-var=bundle_path=$BUNDLE")
  # -input=false alone would also refuse the approval prompt, so only with AUTO_APPROVE.
  if [[ "${AUTO_APPROVE:-}" == 1 && "$cmd" != plan ]]; then args+=("-input=false" "-auto-approve"); fi
  tf init -input=false >/dev/null
  tf "$cmd" "${args[@]}"
}

case "${1:-}" in
  package) package ;;
  plan | apply) package && run "$1" ;;
  # Destroy needs no fresh bundle; the last build's bucket list (if any) keeps for_each keys stable.
  destroy) run destroy ;;
  *) die "usage: deploy/deploy.sh package|plan|apply|destroy" ;;
esac
