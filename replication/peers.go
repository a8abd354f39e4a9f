package replication

import (
	"slices"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/replication/core"
)

// Peer is another PoP of the topology as this one hears it, for a status
// page: when its last presence beacon arrived, and when its last news (a
// delta batch, a snapshot or mitigation bits). A zero time is never since the
// Replicator started.
type Peer struct {
	Region, POP    string
	Beacon, Counts time.Time
}

// peerLog remembers when each other PoP was last heard. The loop writes it
// as it applies what the core accepted; Peers reads it. Nothing on the check
// path touches it.
type peerLog struct {
	mu     sync.Mutex
	beacon map[string]int64 // PoP -> unix ns; requires mu
	counts map[string]int64 // PoP -> unix ns; requires mu
}

// note records that pop was heard at now: a beacon, or news of its counts.
func (l *peerLog) note(pop string, kind core.Kind, now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := &l.counts
	if kind == core.Hello {
		m = &l.beacon
	}
	if *m == nil {
		*m = make(map[string]int64)
	}
	(*m)[pop] = now
}

// Peers returns every other PoP of the topology, its own region's first and
// then by region and name, with when it was last heard. Safe for concurrent
// use.
func (r *Replicator) Peers() []Peer {
	t := r.cfg.Topology
	var out []Peer
	for _, region := range t.Names() {
		for _, pop := range t.Regions[region] {
			if pop != r.cfg.POP {
				out = append(out, Peer{Region: region, POP: pop})
			}
		}
	}
	slices.SortStableFunc(out, func(a, b Peer) int {
		switch own := r.cfg.Region; {
		case a.Region == own && b.Region != own:
			return -1
		case b.Region == own && a.Region != own:
			return 1
		}
		return 0
	})
	at := func(ns int64) time.Time {
		if ns == 0 {
			return time.Time{}
		}
		return time.Unix(0, ns)
	}
	r.peers.mu.Lock()
	defer r.peers.mu.Unlock()
	for i := range out {
		out[i].Beacon = at(r.peers.beacon[out[i].POP])
		out[i].Counts = at(r.peers.counts[out[i].POP])
	}
	return out
}
