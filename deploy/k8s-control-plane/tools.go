//go:build tools

// Package controlplanebuild pins the Kubernetes commands the tests run as build
// dependencies. Nothing compiles this file in a normal build; build.sh runs
//   go build -o ... k8s.io/kubernetes/cmd/<name>
// inside this module so the versions in go.mod/go.sum are used.
package controlplanebuild

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
