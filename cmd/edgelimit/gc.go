package main

import (
	"fmt"
	"os"
	"runtime/debug"
)

// defaultGCPercent is the PoP's garbage collection target (--gc-percent).
//
// The model: a collection cycle marks the live heap, and one starts each
// time the program has allocated GOGC% of the live heap since the last. A
// PoP's live heap is mostly its key table, and what it allocates is mostly
// per request (net/http's request and header maps, the response's
// headers), so the marking work per request is
//
//	live heap × (bytes a request allocates / (live heap × GOGC/100))
//	= bytes a request allocates × 100/GOGC,
//
// whatever the number of keys. That work is taken from the requests being
// served when it runs — a quarter of the cores for the mark workers, and
// assists charged to the goroutines that allocate while it marks — which
// is where the tail of a steady rate comes from once the decision itself
// costs little (docs/performance-redis.md). Four times Go's default
// quarters the cycles and their work per request; the price is memory:
// the heap may grow to five times the live heap between cycles instead of
// twice, e.g. about 750 MB instead of 300 MB for a full default --max-keys
// table (about 150 MB live).
const defaultGCPercent = 400

// setGCPercent sets the garbage collection target to percent, unless
// percent is 0 (Go's default, 100) or the environment's GOGC sets it (Go's
// own setting wins).
func setGCPercent(percent int) error {
	if percent < 0 {
		return fmt.Errorf("--gc-percent must be >= 0, got %d", percent)
	}
	if _, ok := os.LookupEnv("GOGC"); ok || percent == 0 {
		return nil
	}
	debug.SetGCPercent(percent)
	return nil
}
