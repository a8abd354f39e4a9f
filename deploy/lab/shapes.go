package lab

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/simulate"
)

// The traffic shapes the lab drives itself, after the scenario's traffic,
// each on a key of its own (ShapeKey=<shape>) of one global limit of
// ShapeLimit per hour, from the root namespace over the mgmt links, so that
// every decision is recorded with its send and answer times and graded by
// the ledger:
const (
	// ShapePaced: PacedChecks checks at PacedRate a second, round-robin
	// over every PoP server, each sent on time whatever the answers.
	ShapePaced = "paced"
	// ShapeBurst: BurstChecks checks within BurstSpan, round-robin over
	// every PoP server.
	ShapeBurst = "burst"
	// ShapeAlternate: one client sending AlternateChecks checks back to
	// back (Config.AlternateGap after the previous one's answer),
	// alternating between the first server of the first PoP of the first
	// two regions. An exact limiter admits every one.
	ShapeAlternate = "alternate"
)

// Shapes are the shapes in the order the lab runs them.
var Shapes = []string{ShapePaced, ShapeBurst, ShapeAlternate}

// The shapes' limit and sizes.
const (
	ShapeKey        = "shape"
	ShapeLimit      = 100 // per hour
	PacedChecks     = 150
	PacedRate       = 20 // a second
	BurstChecks     = 300
	BurstSpan       = 100 * time.Millisecond
	AlternateChecks = 100
)

// ShapeResult is one shape as the lab ran it, and the simulator's run of
// the same shape on the same scenario's network (nil: none).
type ShapeResult struct {
	Shape       string
	Consistency string
	Checks      int // answered
	Admitted    int
	Errors      int
	Span        time.Duration // first send to last answer
	Rows        []LedgerRow
	Sim         *simulate.Result
}

// ParseShapes parses a comma-separated list of Shapes ("" for none, "all"
// for every one).
func ParseShapes(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	if s == "all" {
		return slices.Clone(Shapes), nil
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		if !slices.Contains(Shapes, f) {
			return nil, fmt.Errorf("lab: shape %q: want one of %s, or all", f, strings.Join(Shapes, ", "))
		}
		out = append(out, f)
	}
	return out, nil
}

// shapeConsistency is the consistency of the shapes' limit: the config's,
// eventual when unset.
func (c Config) shapeConsistency() string {
	if c.Consistency == "" {
		return "eventual"
	}
	return c.Consistency
}

// runShapes runs the config's shapes one after the other, each once every
// PoP server is back at its whole global share, and grades them.
func (l *lab) runShapes(ctx context.Context) ([]ShapeResult, error) {
	hosts := l.pops()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		MaxIdleConnsPerHost: BurstChecks, IdleConnTimeout: time.Minute}}
	defer client.CloseIdleConnections()
	var out []ShapeResult
	for _, shape := range l.cfg.Shapes {
		for _, h := range hosts {
			if err := l.waitFor(ctx, 60*time.Second, h.Name+" at its whole share before shape "+shape, l.shareIs(h, 1)); err != nil {
				return out, err
			}
		}
		res := ShapeResult{Shape: shape, Consistency: l.cfg.shapeConsistency()}
		var (
			mu sync.Mutex
			ds []Decision
			wg sync.WaitGroup
		)
		one := func(h Host) {
			d, err := l.decide(client, h, shape)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.Errors++
				return
			}
			ds = append(ds, d)
		}
		// Open one connection to every server first, as a client's
		// keep-alive pool has: the shapes measure the limit, not TCP's
		// handshake.
		for _, h := range hosts {
			if resp, err := client.Get(fmt.Sprintf("http://%s:%d/readyz", h.IP, popPort)); err == nil {
				resp.Body.Close()
			}
		}
		start := time.Now()
		switch shape {
		case ShapePaced, ShapeBurst:
			n, every := PacedChecks, time.Second/PacedRate
			if shape == ShapeBurst {
				n, every = BurstChecks, BurstSpan/BurstChecks
			}
			for i := range n {
				h := hosts[i%len(hosts)]
				wg.Go(func() {
					if sleep(ctx, time.Until(start.Add(time.Duration(i)*every))) == nil {
						one(h)
					}
				})
			}
			wg.Wait()
		case ShapeAlternate:
			pair := []Host{l.plan.Regions[0].PoPs[0], l.plan.Regions[min(1, len(l.plan.Regions)-1)].PoPs[0]}
			for i := range AlternateChecks {
				if i > 0 && sleep(ctx, l.cfg.AlternateGap) != nil {
					break
				}
				one(pair[i%2])
			}
		}
		if err := ctx.Err(); err != nil {
			return out, err
		}
		res.Checks = len(ds)
		for _, d := range ds {
			if d.Allowed {
				res.Admitted++
			}
			res.Span = max(res.Span, d.Recv.Sub(start))
		}
		res.Rows = Ledger(l.shapeLimit(shape), ds)
		l.logf("shape %s (%s): %d of %d checks admitted in %v, %d errors", shape, res.Consistency, res.Admitted, res.Checks,
			res.Span.Round(time.Millisecond), res.Errors)
		if sim, err := simulate.Run(ShapeScenario(l.plan.Scenario, shape, res.Consistency, res.Span)); err == nil {
			for i := range sim.Results {
				if sim.Results[i].Strategy == simulate.Edgelimit.String() {
					res.Sim = &sim.Results[i]
				}
			}
		} else {
			l.logf("shape %s: the simulator's run: %v", shape, err)
		}
		out = append(out, res)
	}
	return out, nil
}

// shapeLimit is the ledger's limit of shape's key: the shapes' rule, with
// the staleness the eventual bound allows (see Staleness).
func (l *lab) shapeLimit(shape string) LedgerLimit {
	return LedgerLimit{Name: shape, Limit: ShapeLimit, Window: time.Hour,
		Bounded: l.cfg.shapeConsistency() == "bounded", Staleness: Staleness(l.plan.Scenario)}
}

// Staleness is how old, at most, what a PoP of sc's network has heard of
// another PoP's admissions outside faults: one flush interval, the slowest
// link's delay and jitter each way (leaf to leaf goes through the hub, as
// HubRouted lays it out), and one TCP retransmission (Linux's 200 ms floor)
// where links lose.
func Staleness(sc simulate.Scenario) time.Duration {
	lossy := sc.Loss > 0
	for _, l := range sc.Latency {
		if l.Loss != nil && *l.Loss > 0 {
			lossy = true
		}
	}
	s := sc.FlushInterval + 2*slowestLink(sc)
	if lossy {
		s += 200 * time.Millisecond
	}
	return s
}

// ShapeScenario is shape on sc's network as the simulator runs it: the
// shapes' limit with consistency c, the shape's traffic over sc's PoPs (the
// simulator has one server per PoP) for span, the length the lab measured
// (the alternating client's rate is its checks over span), and nothing of
// sc's own traffic or partitions.
func ShapeScenario(sc simulate.Scenario, shape, c string, span time.Duration) simulate.Scenario {
	out := sc
	out.Name = sc.Name + "-" + shape
	out.Partitions = nil
	out.Limit = simulate.Limit{RequestsPerUnit: ShapeLimit, Unit: "hour", Consistency: c}
	span = max(span, time.Millisecond)
	lead := ShapeLead(sc)
	out.Duration = lead + span + time.Second
	switch shape {
	case ShapePaced:
		out.Sources = []simulate.Source{{Name: shape, Key: ShapeKey, Rate: PacedRate, Spread: simulate.Spray, Start: lead, End: lead + PacedChecks*time.Second/PacedRate}}
	case ShapeBurst:
		out.Sources = []simulate.Source{{Name: shape, Key: ShapeKey, Rate: float64(BurstChecks) / BurstSpan.Seconds(), Spread: simulate.Spray, Start: lead, End: lead + BurstSpan}}
	case ShapeAlternate:
		rate := float64(AlternateChecks) / span.Seconds() / 2
		a := sc.Regions[0].PoPs[0]
		b := sc.Regions[min(1, len(sc.Regions)-1)].PoPs[0]
		out.Sources = []simulate.Source{
			{Name: shape + "-a", Key: ShapeKey, Rate: rate, Spread: simulate.Anycast, PoP: a, Start: lead, End: lead + span},
			{Name: shape + "-b", Key: ShapeKey, Rate: rate, Spread: simulate.Anycast, PoP: b, Start: lead, End: lead + span},
		}
	}
	return out
}

// ShapeLead is how long the simulator's PoPs run before a shape starts, as
// the lab's have run when it sends one (it waits for every PoP to hear
// every other, after the scenario): a snapshot interval, a flush and the
// slowest link both ways, so that every PoP has had the others' snapshot.
// A bounded sliding window counts another PoP's whole allowance of the
// previous window as used until that PoP's snapshot says otherwise
// (escrow's P̂); started at the first instant, the simulator's shape would
// be judged by a window the lab's PoPs never see.
func ShapeLead(sc simulate.Scenario) time.Duration {
	lead := cmp.Or(sc.SnapshotInterval, 5*time.Second) + cmp.Or(sc.FlushInterval, 100*time.Millisecond)
	return lead + 2*slowestLink(sc)
}

// slowestLink is the one-way delay of sc's slowest link, its jitter twice
// over.
func slowestLink(sc simulate.Scenario) time.Duration {
	var worst time.Duration
	for _, l := range sc.Latency {
		worst = max(worst, time.Duration((l.Ms+2*l.JitterMs)*float64(time.Millisecond)))
	}
	return worst
}

// decide sends one check of the shapes' key with value shape to h and
// records the decision.
func (l *lab) decide(c *http.Client, h Host, shape string) (Decision, error) {
	body := fmt.Sprintf(`{"domain":%q,"descriptors":[{"entries":[{"key":%q,"value":%q}]}]}`, Domain, ShapeKey, shape)
	send := time.Now()
	resp, err := c.Post(fmt.Sprintf("http://%s:%d/v1/check", h.IP, popPort), "application/json", strings.NewReader(body))
	if err != nil {
		return Decision{}, err
	}
	defer resp.Body.Close()
	var r struct {
		OverallCode string `json:"overall_code"`
	}
	err = json.NewDecoder(resp.Body).Decode(&r)
	recv := time.Now()
	if err != nil || (resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests) {
		return Decision{}, fmt.Errorf("check on %s: %s (%v)", h.Name, resp.Status, err)
	}
	return Decision{Limit: shape, PoP: h.PoP, Send: send, Recv: recv, Hits: 1, Allowed: r.OverallCode == "OK"}, nil
}
