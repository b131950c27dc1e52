//go:build race

package mesh

// raceEnabled: the race detector slows every request some tenfold.
const raceEnabled = true
