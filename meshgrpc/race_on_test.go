//go:build race

package meshgrpc_test

// raceEnabled: the race detector changes what a call allocates.
const raceEnabled = true
