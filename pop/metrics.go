package pop

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/pop/rules"
)

// Metrics are the PoP's Prometheus metrics. Labels stay low-cardinality: a
// domain and a rule name come from the rule files, never from a request, and
// no metric is labelled by key. A nil *Metrics records nothing.
type Metrics struct {
	decisions      *prometheus.CounterVec
	unknownDomains prometheus.Counter
	storeErrors    prometheus.Counter
	latency        *prometheus.HistogramVec
	reloads        *prometheus.CounterVec
	rulesLoaded    prometheus.Gauge
	reloadFailing  prometheus.Gauge
	badRequests    *prometheus.CounterVec
	shadowed       prometheus.Counter
	allowanceWaits *prometheus.HistogramVec
	waiting        prometheus.Gauge
	// observers holds latency's child per API, resolved once: a label lookup
	// per request costs more than the observation.
	observers map[string]prometheus.Observer

	byLimit atomic.Pointer[map[*rules.Limit]*limitCounters]

	// ruleLabels are the (domain, rule) label pairs of the rule set in force,
	// so that a reload can delete the series of the rules it dropped; requires
	// reloadMu held.
	reloadMu   sync.Mutex
	ruleLabels map[ruleLabel]bool
}

// ruleLabel is the (domain, rule) labels of a limit's decision series.
type ruleLabel struct{ domain, rule string }

// outcomes are the values of edgelimit_decisions_total's outcome label.
var outcomes = [...]string{"allowed", "denied", "shadow_denied", "spared", "mitigated"}

type limitCounters struct {
	allowed, denied, shadowDenied, spared, mitigated prometheus.Counter
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgelimit_decisions_total",
			Help: "Limit decisions by domain, rule and outcome: allowed (counted), denied (this limit denied the request), shadow_denied (a shadow_mode limit would have denied), spared (this limit had room but another denied the request, so nothing was counted), mitigated (denied by a mitigation bit without asking the store).",
		}, []string{"domain", "rule", "outcome"}),
		unknownDomains: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgelimit_unknown_domain_checks_total",
			Help: "Checks for a domain no rule file defines; they are allowed, as Envoy's ratelimit does.",
		}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgelimit_check_store_errors_total",
			Help: "Checks the counter store could not decide (answered 500).",
		}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "edgelimit_check_duration_seconds",
			Help:    "Time to decide a check, from a decoded request to a decision, by API.",
			Buckets: []float64{5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 50e-3},
		}, []string{"api"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgelimit_rule_reloads_total",
			Help: "Rule file loads by result (ok, error). After an error the last good rules stay in force.",
		}, []string{"result"}),
		rulesLoaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgelimit_rules_loaded_timestamp_seconds",
			Help: "When the rules in force were loaded.",
		}),
		reloadFailing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgelimit_rule_reload_failing",
			Help: "1 while the rule files on disk fail to load and the last good rules stay in force, else 0.",
		}),
		badRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgelimit_bad_requests_total",
			Help: "Requests rejected with 400, by API.",
		}, []string{"api"}),
	}
	m.shadowed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "edgelimit_shadow_mode_answers_total",
		Help: "Requests a limit denied that were answered OK because the PoP runs in shadow mode (--shadow-mode, Envoy's ratelimit's SHADOW_MODE).",
	})
	m.allowanceWaits = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "edgelimit_bounded_wait_seconds",
		Help:    "Time checks that bounded limits denied waited for allowance another PoP was giving this one (--bounded-wait), by how the wait ended: admitted, or denied (nothing more on its way, or the wait's bound).",
		Buckets: []float64{1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1},
	}, []string{"outcome"})
	m.waiting = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "edgelimit_bounded_waiting_checks",
		Help: "Checks waiting now for bounded allowance another PoP is giving this one (--bounded-wait).",
	})
	reg.MustRegister(m.allowanceWaits, m.waiting, m.decisions, m.unknownDomains, m.storeErrors, m.latency, m.reloads, m.rulesLoaded, m.reloadFailing, m.badRequests, m.shadowed)
	// Both results exist from the start at 0, so that the first failed reload
	// is an increase from 0 that increase() and rate() see, not the birth of
	// a series they ignore.
	for _, result := range []string{"ok", "error"} {
		m.reloads.WithLabelValues(result)
	}
	m.observers = make(map[string]prometheus.Observer)
	for _, api := range []string{"check", "batch", "authz"} {
		m.observers[api] = m.latency.WithLabelValues(api)
	}
	return m
}

// RulesLoaded records a successful load of set and resolves its counters.
// The decision series of rules that set no longer has are deleted, so a
// reload does not leave stale series behind; a rule that stays (same domain
// and name) keeps its counts.
func (m *Metrics) RulesLoaded(set *rules.Set) {
	if m == nil {
		return
	}
	m.reloadMu.Lock()
	defer m.reloadMu.Unlock()
	by := make(map[*rules.Limit]*limitCounters)
	labels := make(map[ruleLabel]bool)
	for _, l := range set.Limits() {
		c := func(outcome string) prometheus.Counter { return m.decisions.WithLabelValues(l.Domain, l.Name, outcome) }
		by[l] = &limitCounters{allowed: c("allowed"), denied: c("denied"), shadowDenied: c("shadow_denied"), spared: c("spared"), mitigated: c("mitigated")}
		labels[ruleLabel{l.Domain, l.Name}] = true
	}
	m.byLimit.Store(&by)
	// A check still running on the old set may increment a deleted child;
	// that count is lost with the series, which is what removing a rule means.
	for old := range m.ruleLabels {
		if !labels[old] {
			for _, o := range outcomes {
				m.decisions.DeleteLabelValues(old.domain, old.rule, o)
			}
		}
	}
	m.ruleLabels = labels
	m.reloads.WithLabelValues("ok").Inc()
	m.rulesLoaded.SetToCurrentTime()
	m.reloadFailing.Set(0)
}

// RulesFailed records a rule load that failed; the rule files stay failing
// until the next RulesLoaded. (The watcher retries only when the files
// change, so the error counter moves once per broken edit: the gauge says
// whether the files on disk are still broken.)
func (m *Metrics) RulesFailed() {
	if m != nil {
		m.reloads.WithLabelValues("error").Inc()
		m.reloadFailing.Set(1)
	}
}

// ObserveCheck records how long a check took on api ("check", "batch", "authz").
func (m *Metrics) ObserveCheck(api string, d time.Duration) {
	if m == nil {
		return
	}
	if o := m.observers[api]; o != nil {
		o.Observe(d.Seconds())
		return
	}
	m.latency.WithLabelValues(api).Observe(d.Seconds())
}

// BadRequest counts a request rejected with 400 on api.
func (m *Metrics) BadRequest(api string) {
	if m != nil {
		m.badRequests.WithLabelValues(api).Inc()
	}
}

func (m *Metrics) decision(l *rules.Limit, allowed, admitted bool) {
	if m == nil {
		return
	}
	by := m.byLimit.Load()
	if by == nil {
		return
	}
	c := (*by)[l]
	if c == nil { // a check that raced a reload
		return
	}
	switch {
	case !allowed && l.Shadow:
		c.shadowDenied.Inc()
	case !allowed:
		c.denied.Inc()
	case admitted:
		c.allowed.Inc()
	default:
		c.spared.Inc()
	}
}

func (m *Metrics) mitigatedDecision(l *rules.Limit) {
	if m == nil {
		return
	}
	if by := m.byLimit.Load(); by != nil {
		if c := (*by)[l]; c != nil {
			c.mitigated.Inc()
		}
	}
}

// waitBegins and allowanceWait bracket a check's wait for bounded allowance.
func (m *Metrics) waitBegins() {
	if m != nil {
		m.waiting.Inc()
	}
}

func (m *Metrics) allowanceWait(d time.Duration, admitted bool) {
	if m == nil {
		return
	}
	outcome := "denied"
	if admitted {
		outcome = "admitted"
	}
	m.waiting.Dec()
	m.allowanceWaits.WithLabelValues(outcome).Observe(d.Seconds())
}

func (m *Metrics) shadowAnswer() {
	if m != nil {
		m.shadowed.Inc()
	}
}

func (m *Metrics) unknownDomain() {
	if m != nil {
		m.unknownDomains.Inc()
	}
}

func (m *Metrics) storeError() {
	if m != nil {
		m.storeErrors.Inc()
	}
}
