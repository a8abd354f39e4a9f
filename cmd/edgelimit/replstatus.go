package main

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgelimit/edgelimit/pop/httpapi"
	"github.com/edgelimit/edgelimit/replication"
)

// replStatus gathers what the status page shows of replication
// (node.ReplicaHooks.ReportStatus).
type replStatus struct {
	r                *replication.Replicator
	nc               *nats.Conn
	direct           map[string]*nats.Conn // --nats-direct, by region
	unreachableAfter time.Duration
	links            *replication.LinkWatch // nil without leaf remotes
	inProcess        bool                   // nc is in process to the embedded server, which has no client port
	// problems are the readiness checks replication adds to /readyz.
	problems []func() error
}

func (s *replStatus) status() httpapi.ReplicationStatus {
	now := time.Now()
	rs := httpapi.ReplicationStatus{
		NATS: s.nc.Status().String(), Connected: s.nc.IsConnected(), NATSURL: s.nc.ConnectedUrlRedacted(),
		Unreachable: s.r.Unreachable(now, s.unreachableAfter),
	}
	if s.inProcess {
		rs.NATSURL = "embedded, in process (no client port)"
	}
	if rs.Unreachable == nil {
		rs.Unreachable = []string{}
	}
	cut := map[string]bool{}
	for _, region := range rs.Unreachable {
		cut[region] = true
	}
	ago := func(t time.Time) *float64 {
		if t.IsZero() {
			return nil
		}
		v := max(now.Sub(t).Seconds(), 0)
		return &v
	}
	rs.Peers = []httpapi.PeerStatus{}
	for _, p := range s.r.Peers() {
		rs.Peers = append(rs.Peers, httpapi.PeerStatus{PoP: p.POP, Region: p.Region,
			BeaconAgoSeconds: ago(p.Beacon), DataAgoSeconds: ago(p.Counts), RegionUnreachable: cut[p.Region]})
	}
	for _, check := range s.problems {
		if err := check(); err != nil {
			rs.Problems = append(rs.Problems, err.Error())
		}
	}
	if n := s.links.Down(); n > 0 {
		rs.Problems = append(rs.Problems, fmt.Sprintf("%d leaf link(s) to the hub region down: this region counts alone meanwhile", n))
	}
	for _, region := range slices.Sorted(maps.Keys(s.direct)) {
		if c := s.direct[region]; !c.IsConnected() {
			rs.Problems = append(rs.Problems, fmt.Sprintf("direct connection to region %s (--nats-direct): %s", region, c.Status()))
		}
	}
	st := s.r.Stats()
	rs.LagP50Seconds, rs.LagP99Seconds, rs.LagBatches = st.Lag.P50.Seconds(), st.Lag.P99.Seconds(), st.Lag.Count
	return rs
}
