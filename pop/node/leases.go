package node

import (
	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/store"
)

// leaserFor returns where the PoP holds concurrency leases: in the Redis the
// PoP's servers share when counts is the Redis store (so the limit holds
// across them), else in this process (store.Leases). Leases do not fall back
// to the embedded store when Redis fails: a slot taken there could not be
// released through another server; the engine fails open instead (or denies
// a fail_closed limit). The embedded store's leases are its own
// (store.Memory.Leases), so that its durable state keeps them across a
// restart.
func leaserFor(counts Counts) pop.Leaser {
	if l, ok := counts.(pop.Leaser); ok {
		return l
	}
	if m, ok := counts.(*store.Memory); ok {
		return m.Leases()
	}
	return store.NewLeases()
}
