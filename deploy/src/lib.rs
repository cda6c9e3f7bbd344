//! What an operator deploys, and nothing to link: `helm/redirect-cni` (the chart, with Istio's
//! `istio-cni` value names), `kubernetes/` and `openshift/` (the same objects as plain
//! manifests). The tests beside them (`tests/`) parse every manifest against Kubernetes'
//! schemas and the programs' settings (`manifests`), render the chart with helm and compare it
//! with the plain manifests (`helm_chart`), and apply both to a real API server
//! (`real_apiserver`). The guide is docs/deploy/README.md.

#![deny(missing_docs)]
