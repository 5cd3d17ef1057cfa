//go:build tools

// Package kustomizebuild pins the kustomize CLI (Apache-2.0) as a build dependency.
// Nothing imports or compiles this file in a normal build; deploy/kustomize/build.sh runs
//   go build -o ... sigs.k8s.io/kustomize/kustomize/v5
// inside this module so the versions in go.mod/go.sum are used.
package kustomizebuild

import (
	_ "sigs.k8s.io/kustomize/kustomize/v5"
)
