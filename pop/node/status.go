package node

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/httpapi"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

// statusSource makes the PoP's GET /status (httpapi.Status) from what the
// PoP already has: its configuration, the store's health and breaker, the
// rules the watcher loaded, what replication reports, and the decision
// metrics. It reads them when a page is asked for and every
// trafficSampleEvery; the check path never waits on it.
type statusSource struct {
	cfg     *Config
	started time.Time
	listen  string
	eng     *pop.Engine
	mit     *pop.Mitigations // nil without replication
	mem     *store.Memory
	fb      *store.Fallback // nil on the embedded store
	health  *storeHealth
	ready   func() error
	// metrics gathers pop.Metrics' series alone (teeRegisterer), so that
	// a sample does not collect the Go runtime's and the process's.
	metrics prometheus.Gatherer

	repl atomic.Pointer[func() httpapi.ReplicationStatus] // ReplicaHooks.ReportStatus

	mu      sync.Mutex
	rules   ruleLog         // requires mu
	samples []trafficSample // oldest first, at most trafficSamples; requires mu
}

// ruleLog is what the status page says of rule loads.
type ruleLog struct {
	domains, limits int
	version         string // rulesVersion of the rules in force
	loadedAt        time.Time
	loads, failures uint64
	lastErr         string // "" once a load succeeds again
	lastErrAt       time.Time
	// watched is set by the watcher's first load, which loads the files
	// Run loaded at start once more: that one is not counted again.
	watched bool
}

// trafficSample is the decision metrics' totals at one time.
type trafficSample struct {
	at                                     time.Time
	requests, decisions, denied, mitigated uint64
}

const (
	// trafficSampleEvery is how often the totals are sampled in the
	// background, and trafficSamples how many are kept: the page's rates
	// are over the last trafficSampleEvery × (trafficSamples−1) or so.
	trafficSampleEvery = 2 * time.Second
	trafficSamples     = 6
)

// loaded records a successful load of set at now: Run's at start, or the
// watcher's.
func (s *statusSource) loaded(set *rules.Set, now time.Time, watcher bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules.domains, s.rules.limits = len(set.Domains()), len(set.Limits())
	s.rules.version = rulesVersion(set)
	s.rules.lastErr = ""
	if watcher && !s.rules.watched {
		s.rules.watched = true // the start's rules again (or newer ones)
		return
	}
	s.rules.loadedAt = now
	s.rules.loads++
}

// rulesVersion names the limits of set: the first 12 hex digits of a SHA-256
// of the domains and every limit, field by field. PoPs that show the same
// version enforce the same limits, whatever the files' names, comments or
// order of domains; an edit that changes a limit changes it.
func rulesVersion(set *rules.Set) string {
	h := sha256.New()
	enc := json.NewEncoder(h) // a map's keys (a limit's metadata) in sorted order
	if enc.Encode(set.Domains()) != nil || enc.Encode(set.Limits()) != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// failed records a failed reload at now.
func (s *statusSource) failed(err error, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules.failures++
	s.rules.lastErr, s.rules.lastErrAt = err.Error(), now
}

// sample takes the totals now; with keep, it also joins the kept samples.
func (s *statusSource) sample(now time.Time, keep bool) trafficSample {
	t := trafficSample{at: now}
	mfs, _ := s.metrics.Gather() // a partial gather still counts what it has
	for _, mf := range mfs {
		switch mf.GetName() {
		case "edgelimit_check_duration_seconds":
			for _, m := range mf.GetMetric() {
				t.requests += m.GetHistogram().GetSampleCount()
			}
		case "edgelimit_decisions_total":
			for _, m := range mf.GetMetric() {
				n := uint64(m.GetCounter().GetValue())
				var outcome string
				for _, l := range m.GetLabel() {
					if l.GetName() == "outcome" {
						outcome = l.GetValue()
					}
				}
				t.decisions += n
				switch outcome {
				case "denied":
					t.denied += n
				case "mitigated":
					t.denied += n
					t.mitigated += n
				}
			}
		}
	}
	if keep {
		s.mu.Lock()
		s.samples = append(s.samples, t)
		if len(s.samples) > trafficSamples {
			s.samples = s.samples[len(s.samples)-trafficSamples:]
		}
		s.mu.Unlock()
	}
	return t
}

// status makes the page's facts at now.
func (s *statusSource) status(now time.Time) *httpapi.Status {
	st := &httpapi.Status{
		PoP: s.cfg.Replica, Region: s.cfg.Region, Listen: s.listen, Version: s.cfg.Version,
		Started: s.started, Now: now, UptimeSeconds: now.Sub(s.started).Seconds(), Ready: true,
	}
	if st.Version == "" {
		st.Version = "edgelimit (version unknown)"
	}
	if err := s.ready(); err != nil {
		st.Ready, st.NotReady = false, err.Error()
	}

	st.Store = httpapi.StoreStatus{Kind: "embedded", Reachable: true, Keys: s.mem.Len()}
	if s.fb != nil {
		st.Store.Kind, st.Store.Address = "redis", storeName(s.cfg.Store)
		st.Store.Breaker = s.fb.BreakerState().String()
		st.Store.FallbackDecisions = s.fb.Stats().FallbackDecisions
		if err, since := s.health.state(); err != nil {
			st.Store.Reachable, st.Store.Error, st.Store.FailingSince = false, err.Error(), &since
		}
	}

	cur := s.sample(now, false)
	s.mu.Lock()
	r := s.rules
	var base *trafficSample
	for i := range s.samples { // the oldest kept, if a second or more before
		if cur.at.Sub(s.samples[i].at) >= time.Second {
			base = &s.samples[i]
			break
		}
	}
	var prev trafficSample
	if base != nil {
		prev = *base
	}
	s.mu.Unlock()

	st.Rules = httpapi.RulesStatus{Files: s.cfg.Rules, Domains: r.domains, Limits: r.limits, Version: r.version, LoadedAt: r.loadedAt,
		Loads: r.loads, Failures: r.failures, LastError: r.lastErr}
	if r.lastErr != "" {
		at := r.lastErrAt
		st.Rules.LastErrorAt = &at
	}

	st.Traffic = httpapi.TrafficStatus{Requests: cur.requests, Decisions: cur.decisions, Denied: cur.denied, Mitigated: cur.mitigated}
	if base != nil {
		dt := cur.at.Sub(prev.at).Seconds()
		rate := func(a, b uint64) float64 {
			if a < b { // a series deleted by a reload
				return 0
			}
			return float64(a-b) / dt
		}
		st.Traffic.RateSeconds = dt
		st.Traffic.RequestsPerSecond = rate(cur.requests, prev.requests)
		st.Traffic.DecisionsPerSecond = rate(cur.decisions, prev.decisions)
		st.Traffic.DeniedPerSecond = rate(cur.denied, prev.denied)
	}
	if s.mit != nil {
		st.Traffic.MitigationBits = len(s.mit.Active(now.UnixNano()))
	}

	if f := s.repl.Load(); f != nil {
		rs := (*f)()
		rs.GlobalShare = s.eng.GlobalShare()
		st.Repl = &rs
	} else if s.cfg.Replicate != nil {
		st.Repl = &httpapi.ReplicationStatus{NATS: "starting", GlobalShare: s.eng.GlobalShare()}
	}
	return st
}

// teeRegisterer registers every collector with both registerers: the PoP's
// registry, which /metrics serves, and the status page's own, which holds
// pop.Metrics alone and so is cheap to gather every few seconds.
type teeRegisterer struct{ a, b prometheus.Registerer }

func (t teeRegisterer) Register(c prometheus.Collector) error {
	if err := t.a.Register(c); err != nil {
		return err
	}
	if err := t.b.Register(c); err != nil {
		t.a.Unregister(c)
		return err
	}
	return nil
}

func (t teeRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := t.Register(c); err != nil {
			panic(err)
		}
	}
}

func (t teeRegisterer) Unregister(c prometheus.Collector) bool {
	a := t.a.Unregister(c)
	b := t.b.Unregister(c)
	return a || b
}

// state returns the store's failure, and since when it has failed; a nil
// error while the store is healthy.
func (h *storeHealth) state() (err error, since time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err, h.since
}
