package node

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/store"
)

// openStrong returns the store that decides limits with consistency strong
// at their key's home (store.Strong) over st, with its metrics in reg, or
// nil for a PoP that does not replicate (a standalone PoP counts every
// scope on its own, strong limits too).
func openStrong(cfg Config, st pop.Store, reg prometheus.Registerer) (*store.Strong, error) {
	if cfg.Replica == "" || cfg.Replicate == nil || len(cfg.Topology.Regions) == 0 {
		return nil, nil
	}
	added := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "edgelimit_strong_added_latency_seconds",
		Help: "Time a check of a limit with consistency strong waited on its key's home PoP in another place: the round trip of the request, " +
			"or the wait before the home was taken as unreachable.",
		Buckets: []float64{1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1, 2.5},
	})
	reg.MustRegister(added)
	s, err := store.NewStrong(st, store.StrongConfig{Self: cfg.Replica, Region: cfg.Region, Regions: cfg.Topology.Regions,
		PartitionShare: cfg.PartitionShare,
		Observe:        func(d time.Duration, _ bool) { added.Observe(d.Seconds()) }})
	if err != nil {
		return nil, fmt.Errorf("consistency strong: %w", err)
	}
	for _, c := range []struct {
		name, help string
		get        func(store.StrongStats) uint64
	}{
		{"edgelimit_strong_home_unreachable_total", "Checks of a limit with consistency strong whose home PoP gave no valid reply in time (or was left alone after such), decided by the limit's policy: denied when fail_closed, else on local knowledge at the partition share.",
			func(st store.StrongStats) uint64 { return st.Unreachable }},
		{"edgelimit_strong_fail_closed_denials_total", "Checks of a fail_closed limit with consistency strong denied because the key's home PoP could not be reached.",
			func(st store.StrongStats) uint64 { return st.FailClosedDenials }},
		{"edgelimit_strong_asked_total", "Requests this PoP sent to the home PoP of a key with consistency strong.",
			func(st store.StrongStats) uint64 { return st.Asked }},
		{"edgelimit_strong_answered_total", "Requests of other PoPs this PoP decided as the home of their key (consistency strong).",
			func(st store.StrongStats) uint64 { return st.Answered }},
		{"edgelimit_strong_refused_total", "Requests of other PoPs this PoP refused to decide: malformed, or for a key it is not the home of.",
			func(st store.StrongStats) uint64 { return st.Refused }},
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help},
			func() float64 { return float64(c.get(s.Stats())) }))
	}
	return s, nil
}
