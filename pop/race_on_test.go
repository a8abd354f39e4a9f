//go:build race

package pop

// raceEnabled: the race detector allocates on its own, so allocation counts
// are not the code's.
const raceEnabled = true
