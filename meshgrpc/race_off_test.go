//go:build !race

package meshgrpc_test

const raceEnabled = false
