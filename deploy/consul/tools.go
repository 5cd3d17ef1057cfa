//go:build tools

// Package consulbuild pins the HashiCorp Consul agent (open-source, MPL-2.0,
// 1.14.x) as a build dependency. Nothing imports or compiles this file in a
// normal build; deploy/consul/build.sh runs
//   go build -o ... github.com/hashicorp/consul
// inside this module so the versions in go.mod/go.sum are used.
package consulbuild

import (
	_ "github.com/hashicorp/consul"
)
