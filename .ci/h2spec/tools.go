//go:build tools

// Package h2spec pins the build of the h2spec conformance tool that .ci/run
// installs, with its dependencies, so that CI builds the same binary every
// time.
package h2spec

import _ "github.com/summerwind/h2spec/cmd/h2spec"
