//go:build tools

// Package grpcurlbuild pins github.com/fullstorydev/grpcurl as a build
// dependency. Nothing compiles this file in a normal build;
// deploy/grpcurl/build.sh runs
//   go build -o ... github.com/fullstorydev/grpcurl/cmd/grpcurl
// inside this module so the versions in go.mod/go.sum are used.
package grpcurlbuild

import (
	_ "github.com/fullstorydev/grpcurl/cmd/grpcurl"
)
