# Providers for spotorch's deployment. google-beta only for google_project_service_identity
# (the Pub/Sub and Eventarc service agents must exist before anything relies on them); time only
# for time_sleep (the wait for the Eventarc agent's permissions, iam.tf). Pinned to the 6.x line
# the configuration was written against; 7.0 removed deprecated arguments.
terraform {
  required_version = ">= 1.5"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.0, < 7.0"
    }
    google-beta = {
      source  = "hashicorp/google-beta"
      version = ">= 6.0, < 7.0"
    }
    time = {
      source  = "hashicorp/time"
      version = ">= 0.9, < 1.0"
    }
  }
}

provider "google" {
  project = var.project_id
  region  = var.region
}

provider "google-beta" {
  project = var.project_id
  region  = var.region
}
