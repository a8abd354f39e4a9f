package simulate

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// Scenario is one simulation: the topology, the network between regions, the
// limit, and the traffic. LoadScenario reads it from YAML; Validate checks it.
type Scenario struct {
	Name string `yaml:"name"`
	// Seed drives every random choice of a run; the same seed replays it.
	Seed uint64 `yaml:"seed"`
	// Duration is the simulated time the run covers.
	Duration time.Duration `yaml:"duration"`
	// FlushInterval is how often each PoP publishes its delta (replication's
	// FlushInterval); default 100ms.
	FlushInterval time.Duration `yaml:"flush_interval"`
	// SnapshotInterval is how often each PoP publishes its full own state
	// (anti-entropy, replication's SnapshotInterval); default 5s.
	SnapshotInterval time.Duration `yaml:"snapshot_interval"`
	Regions          []Region      `yaml:"regions"`
	// Latency is the one-way latency between regions, symmetric. Every pair of
	// distinct regions needs an entry; a region with itself defaults to 0.
	Latency []Link `yaml:"latency"`
	// Loss is the probability that a message on a link between two
	// regions is lost once, as a TCP segment is: it arrives a
	// retransmission (200 ms) late, with every message behind it.
	Loss float64 `yaml:"loss"`
	// Duplicate is the probability that a message to one PoP arrives twice.
	Duplicate float64 `yaml:"duplicate"`
	// Direct gives every PoP a second path to the other regions, as
	// `edgelimit pop --nats-direct` does: a connection of its own to each
	// other region's NATS servers, on which it takes that region's bits and
	// the slots of its deltas whose keys are near their limit
	// (store.Memory.Hot), beside the stream. Those then cross every link
	// between regions twice, on two connections that lose and stall
	// independently (a TCP connection held behind a lost segment holds only
	// itself), and the first copy to arrive counts; the second joins again,
	// which changes nothing. Only the edgelimit strategy has it (the others
	// are the baselines); its bytes count the copies.
	Direct     bool        `yaml:"direct"`
	Partitions []Partition `yaml:"partitions"`
	// BitsInterval is replication's BitsInterval: a PoP publishes the
	// mitigation bits it issues at once, at most once per BitsInterval;
	// default 10ms.
	BitsInterval time.Duration `yaml:"bits_interval"`
	// HelloInterval is how often each PoP sends a presence beacon to the
	// other regions (replication's HelloInterval); default 500ms. Beacons
	// travel like core NATS messages: one sent across a cut link is lost,
	// not held.
	HelloInterval time.Duration `yaml:"hello_interval"`
	// UnreachableAfter is how long a PoP hears no beacon from a region before
	// it counts the region as cut off and enforces only its share of every
	// global limit (region.Share); default 3s, as `edgelimit pop`.
	UnreachableAfter time.Duration `yaml:"unreachable_after"`
	// PartitionShare is `edgelimit pop --partition-share`: the share of a
	// global limit each reachable region enforces during a partition (0:
	// reachable regions / all regions).
	PartitionShare float64 `yaml:"partition_share"`
	// BoundedWait is `edgelimit pop --bounded-wait`: how long a check that a
	// bounded limit denied waits for allowance on its way to its PoP, then
	// is decided again (pop.Engine.UseAllowanceWait); absent: the PoP's
	// default (pop.DefaultBoundedWait); 0: checks never wait.
	BoundedWait *time.Duration `yaml:"bounded_wait"`
	// ClockSkew offsets a PoP's clock from true time (positive: ahead), by
	// PoP name. The PoP decides, windows and bits on its own clock.
	ClockSkew map[string]time.Duration `yaml:"clock_skew"`
	Limit     Limit                    `yaml:"limit"`
	Sources   []Source                 `yaml:"sources"`
	// Mix adds a generated population of many small sources, each with its
	// own key, to Sources.
	Mix *Mix `yaml:"mix"`
}

// Mix is a generated population of sources, each with a key of its own (a
// client address, say), in the spirit of the traffic behind Cloudflare's
// accuracy figure (400M requests from 270k sources): most sources stay far
// below the limit, a heavy tail comes near it, and a few abuse it.
type Mix struct {
	// Sources is the number of sources.
	Sources int `yaml:"sources"`
	// MeanRate is the mean request rate of the well-behaved sources, per
	// second. Their rates follow a Pareto distribution of shape Alpha
	// (default 1.5; nearer 1 is a heavier tail) with that mean, capped at
	// MaxRate (default: the limit's own rate, limit ÷ unit).
	MeanRate float64 `yaml:"mean_rate"`
	Alpha    float64 `yaml:"alpha"`
	MaxRate  float64 `yaml:"max_rate"`
	// Abusive is the share of sources that abuse the limit: each sends at
	// AbuseMin to AbuseMax times the limit's rate (log-uniform), during an
	// interval of AbuseFor (default a quarter of the run) starting at a
	// uniformly random time.
	Abusive  float64       `yaml:"abusive"`
	AbuseMin float64       `yaml:"abuse_min"`
	AbuseMax float64       `yaml:"abuse_max"`
	AbuseFor time.Duration `yaml:"abuse_for"`
	// Spread gives the share of sources of each spread (anycast, spray,
	// random); default all anycast, to a PoP drawn at random.
	Spread map[Spread]float64 `yaml:"spread"`
}

// Region is a named group of PoPs. PoP names are unique across regions.
type Region struct {
	Name string   `yaml:"name"`
	PoPs []string `yaml:"pops"`
}

// Link is the one-way latency between regions From and To (either way):
// Ms, plus a uniform jitter in [-JitterMs, +JitterMs], never below zero.
// Loss, when set, replaces the scenario's Loss on this link (between two
// regions only): a path over two links, as the lab's leaf regions reach
// each other through the hub (deploy/lab's HubRouted), loses on both.
type Link struct {
	From     string   `yaml:"from"`
	To       string   `yaml:"to"`
	Ms       float64  `yaml:"ms"`
	JitterMs float64  `yaml:"jitter_ms"`
	Loss     *float64 `yaml:"loss,omitempty"`
}

// Partition cuts the link between regions From and To (both ways unless
// OneWay) from Start to End. Messages sent across a cut link are not lost:
// as with JetStream stream sourcing, they are held and delivered after the
// link heals (plus the link's latency).
type Partition struct {
	From   string        `yaml:"from"`
	To     string        `yaml:"to"`
	Start  time.Duration `yaml:"start"`
	End    time.Duration `yaml:"end"`
	OneWay bool          `yaml:"oneway"`
}

// Limit is the one limit every request is checked against, in the terms of
// a rule file's rate_limit.
type Limit struct {
	RequestsPerUnit int64  `yaml:"requests_per_unit"`
	Unit            string `yaml:"unit"`
	// Algorithm is sliding_window (default) or fixed_window, the algorithms
	// that replicate.
	Algorithm string `yaml:"algorithm"`
	// Consistency is how the replicated strategies (edgelimit, async-sync)
	// hold the limit: eventual (default), bounded or strong
	// (rate_limit.consistency; edgelimit sim --consistency overrides it).
	// With bounded or strong the estimate plays no part but, for strong,
	// when a key's home does not answer, so both rows decide nearly alike.
	Consistency string `yaml:"consistency"`
}

// consistency returns the limit's consistency.
func (l *Limit) consistency() (limit.Consistency, error) {
	return limit.ParseConsistency(l.Consistency)
}

// Spread says how a source's requests pick a PoP.
type Spread string

const (
	// Anycast sends every request of the source to one PoP: Source.PoP, or
	// else the PoP at the source's index modulo the number of PoPs.
	Anycast Spread = "anycast"
	// Spray sends the source's requests round-robin to all PoPs.
	Spray Spread = "spray"
	// Random sends each request to a PoP chosen uniformly at random.
	Random Spread = "random"
)

// Source is a client sending requests at Rate per second (Poisson arrivals)
// between Start and End (default: the whole run). With On and Off set it
// sends only during the first On of every On+Off from Start: a bursty or
// periodic client. With RateEnd set the rate ramps linearly from Rate at
// Start to RateEnd at End (a Poisson process of that changing rate): a
// client that grows into or out of its limit. Sources with the same Key
// share one limit, as the clients of one tenant do; the default key is
// "tenant".
type Source struct {
	Name   string        `yaml:"name"`
	Key    string        `yaml:"key"`
	Rate   float64       `yaml:"rate"`
	Spread Spread        `yaml:"spread"`
	PoP    string        `yaml:"pop"`
	Start  time.Duration `yaml:"start"`
	End    time.Duration `yaml:"end"`
	On     time.Duration `yaml:"on"`
	Off    time.Duration `yaml:"off"`

	// RateEnd is the rate at End when the rate ramps; 0 (unset): Rate
	// throughout.
	RateEnd float64 `yaml:"rate_end"`
}

// DefaultKey is the limit key of a source that names none.
const DefaultKey = "tenant"

// LoadScenario reads a scenario from a YAML file, rejecting unknown fields,
// and validates it.
func LoadScenario(path string) (Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Scenario{}, fmt.Errorf("simulate: %w", err)
	}
	sc, err := ParseScenario(data)
	if err != nil {
		return Scenario{}, fmt.Errorf("simulate: %s: %w", path, err)
	}
	return sc, nil
}

// ParseScenario decodes a YAML scenario, rejecting unknown fields, and
// validates it.
func ParseScenario(data []byte) (Scenario, error) {
	var sc Scenario
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&sc); err != nil {
		return Scenario{}, err
	}
	if err := sc.Validate(); err != nil {
		return Scenario{}, err
	}
	return sc, nil
}

// ErrNoPoPs is returned by Validate for a scenario without any PoP.
var ErrNoPoPs = errors.New("no PoPs: regions must name at least one PoP")

// Validate checks the scenario and fills in defaults (flush and snapshot
// intervals, algorithm, source end).
func (sc *Scenario) Validate() error {
	if sc.Duration <= 0 {
		return fmt.Errorf("duration: must be positive, got %v", sc.Duration)
	}
	for _, d := range []struct {
		v    *time.Duration
		def  time.Duration
		name string
	}{ // the defaults are replication's and `edgelimit pop`'s
		{&sc.FlushInterval, 100 * time.Millisecond, "flush_interval"},
		{&sc.SnapshotInterval, 5 * time.Second, "snapshot_interval"},
		{&sc.BitsInterval, 10 * time.Millisecond, "bits_interval"},
		{&sc.HelloInterval, 500 * time.Millisecond, "hello_interval"},
		{&sc.UnreachableAfter, 3 * time.Second, "unreachable_after"},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
		if *d.v < 0 {
			return fmt.Errorf("%s: must be positive, got %v", d.name, *d.v)
		}
	}
	if sc.BoundedWait != nil && *sc.BoundedWait < 0 {
		return fmt.Errorf("bounded_wait: must be 0 or more, got %v", *sc.BoundedWait)
	}
	regions := map[string]bool{}
	pops := map[string]bool{}
	for i, r := range sc.Regions {
		if r.Name == "" {
			return fmt.Errorf("regions[%d].name: is required", i)
		}
		if regions[r.Name] {
			return fmt.Errorf("regions[%d].name: region %q named twice", i, r.Name)
		}
		regions[r.Name] = true
		if len(r.PoPs) == 0 {
			return fmt.Errorf("regions[%d].pops: region %q has no PoPs", i, r.Name)
		}
		for j, p := range r.PoPs {
			if p == "" {
				return fmt.Errorf("regions[%d].pops[%d]: empty PoP name", i, j)
			}
			if pops[p] {
				return fmt.Errorf("regions[%d].pops[%d]: PoP %q named twice", i, j, p)
			}
			pops[p] = true
		}
	}
	if len(pops) == 0 {
		return ErrNoPoPs
	}
	type pair struct{ a, b string }
	seen := map[pair]bool{}
	for i, l := range sc.Latency {
		if !regions[l.From] || !regions[l.To] {
			return fmt.Errorf("latency[%d]: unknown region in %q–%q", i, l.From, l.To)
		}
		if l.Ms < 0 || l.JitterMs < 0 || math.IsNaN(l.Ms) || math.IsNaN(l.JitterMs) {
			return fmt.Errorf("latency[%d]: ms and jitter_ms must be ≥ 0, got %v and %v", i, l.Ms, l.JitterMs)
		}
		if l.Loss != nil && !(*l.Loss >= 0 && *l.Loss < 1) {
			return fmt.Errorf("latency[%d]: loss must be in [0, 1), got %v", i, *l.Loss)
		}
		if seen[pair{l.From, l.To}] {
			return fmt.Errorf("latency[%d]: regions %q and %q given twice", i, l.From, l.To)
		}
		seen[pair{l.From, l.To}], seen[pair{l.To, l.From}] = true, true
	}
	for i, a := range sc.Regions {
		for _, b := range sc.Regions[i+1:] {
			if !seen[pair{a.Name, b.Name}] {
				return fmt.Errorf("latency: no entry for regions %q and %q", a.Name, b.Name)
			}
		}
	}
	if !(sc.Loss >= 0 && sc.Loss < 1) {
		return fmt.Errorf("loss: must be in [0, 1), got %v", sc.Loss)
	}
	if !(sc.Duplicate >= 0 && sc.Duplicate < 1) {
		return fmt.Errorf("duplicate: must be in [0, 1), got %v", sc.Duplicate)
	}
	for i, p := range sc.Partitions {
		if !regions[p.From] || !regions[p.To] {
			return fmt.Errorf("partitions[%d]: unknown region in %q–%q", i, p.From, p.To)
		}
		if p.From == p.To {
			return fmt.Errorf("partitions[%d]: a region cannot be cut from itself (%q)", i, p.From)
		}
		if p.Start < 0 || p.End <= p.Start {
			return fmt.Errorf("partitions[%d]: need 0 ≤ start < end, got start %v end %v", i, p.Start, p.End)
		}
	}
	if !(sc.PartitionShare >= 0 && sc.PartitionShare <= 1) {
		return fmt.Errorf("partition_share: must be in [0, 1], got %v", sc.PartitionShare)
	}
	for p := range sc.ClockSkew {
		if !pops[p] {
			return fmt.Errorf("clock_skew: unknown PoP %q", p)
		}
	}
	spec, _, err := sc.Limit.spec()
	if err != nil {
		return fmt.Errorf("limit: %w", err)
	}
	if _, err := sc.Limit.consistency(); err != nil {
		return fmt.Errorf("limit: %w", err)
	}
	if sc.Mix != nil {
		if err := sc.Mix.validate(sc, float64(spec.Limit)/time.Duration(spec.Window).Seconds()); err != nil {
			return fmt.Errorf("mix: %w", err)
		}
	}
	if len(sc.Sources) == 0 && sc.Mix == nil {
		return errors.New("sources: at least one source (or a mix) is required")
	}
	for i := range sc.Sources {
		s := &sc.Sources[i]
		if !(s.Rate > 0) || math.IsInf(s.Rate, 0) {
			return fmt.Errorf("sources[%d].rate: must be positive, got %v", i, s.Rate)
		}
		if !(s.RateEnd >= 0) || math.IsInf(s.RateEnd, 0) {
			return fmt.Errorf("sources[%d].rate_end: must be positive (or 0 for no ramp), got %v", i, s.RateEnd)
		}
		switch s.Spread {
		case Anycast:
			if s.PoP != "" && !pops[s.PoP] {
				return fmt.Errorf("sources[%d].pop: unknown PoP %q", i, s.PoP)
			}
		case Spray, Random:
			if s.PoP != "" {
				return fmt.Errorf("sources[%d].pop: only an anycast source names a PoP", i)
			}
		default:
			return fmt.Errorf("sources[%d].spread: %q is not anycast, spray or random", i, s.Spread)
		}
		if s.End == 0 {
			s.End = sc.Duration
		}
		if s.Start < 0 || s.End <= s.Start {
			return fmt.Errorf("sources[%d]: need 0 ≤ start < end, got start %v end %v", i, s.Start, s.End)
		}
		if s.On < 0 || s.Off < 0 || (s.On == 0) != (s.Off == 0) {
			return fmt.Errorf("sources[%d]: on and off go together and must be positive, got on %v off %v", i, s.On, s.Off)
		}
		if s.Key == "" {
			s.Key = DefaultKey
		}
	}
	return nil
}

// validate checks m and fills in its defaults; limitRate is the limit's own
// rate per second.
func (m *Mix) validate(sc *Scenario, limitRate float64) error {
	if m.Sources <= 0 {
		return fmt.Errorf("sources: must be positive, got %d", m.Sources)
	}
	if !(m.MeanRate > 0) || math.IsInf(m.MeanRate, 0) {
		return fmt.Errorf("mean_rate: must be positive, got %v", m.MeanRate)
	}
	if m.Alpha == 0 {
		m.Alpha = 1.5
	}
	if !(m.Alpha > 1) || math.IsInf(m.Alpha, 0) {
		return fmt.Errorf("alpha: must be above 1 (a Pareto of shape ≤ 1 has no mean), got %v", m.Alpha)
	}
	if m.MaxRate == 0 {
		m.MaxRate = limitRate
	}
	if !(m.MaxRate >= m.MeanRate) {
		return fmt.Errorf("max_rate: must be at least mean_rate %v, got %v", m.MeanRate, m.MaxRate)
	}
	if !(m.Abusive >= 0 && m.Abusive <= 1) {
		return fmt.Errorf("abusive: must be in [0, 1], got %v", m.Abusive)
	}
	if m.Abusive > 0 {
		if m.AbuseMin == 0 {
			m.AbuseMin = 2
		}
		if m.AbuseMax == 0 {
			m.AbuseMax = 20
		}
		if !(m.AbuseMin > 0 && m.AbuseMax >= m.AbuseMin) || math.IsInf(m.AbuseMax, 0) {
			return fmt.Errorf("abuse_min, abuse_max: need 0 < min ≤ max, got %v and %v", m.AbuseMin, m.AbuseMax)
		}
	}
	if m.AbuseFor == 0 {
		m.AbuseFor = sc.Duration / 4
	}
	if m.AbuseFor < 0 {
		return fmt.Errorf("abuse_for: must be positive, got %v", m.AbuseFor)
	}
	total := 0.0
	for sp, w := range m.Spread {
		switch sp {
		case Anycast, Spray, Random:
		default:
			return fmt.Errorf("spread: %q is not anycast, spray or random", sp)
		}
		if !(w >= 0) || math.IsInf(w, 0) {
			return fmt.Errorf("spread: share of %s must be ≥ 0, got %v", sp, w)
		}
		total += w
	}
	if len(m.Spread) > 0 && total <= 0 {
		return errors.New("spread: shares add up to zero")
	}
	return nil
}

// spec returns the limit's algorithm spec and unit.
func (l *Limit) spec() (limit.Spec, rules.Unit, error) {
	unit, err := rules.ParseUnit(l.Unit)
	if err != nil {
		return limit.Spec{}, 0, err
	}
	if l.Algorithm == "" {
		l.Algorithm = "sliding_window"
	}
	alg, err := limit.ParseAlgorithm(l.Algorithm)
	if err != nil {
		return limit.Spec{}, 0, err
	}
	if !alg.Replicable() {
		return limit.Spec{}, 0, fmt.Errorf("algorithm %s does not replicate (want sliding_window or fixed_window)", alg)
	}
	if l.RequestsPerUnit <= 0 {
		return limit.Spec{}, 0, fmt.Errorf("requests_per_unit: must be positive, got %d", l.RequestsPerUnit)
	}
	s := limit.Spec{Algorithm: alg, Limit: l.RequestsPerUnit, Window: int64(unit.Duration())}
	return s, unit, s.Validate()
}
