package lab

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/pop/loadgen"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// loadConns is the connections of each load: enough that a paced rate of a
// few thousand per second is not held back by one slow answer.
const loadConns = 8

// sharePoint is one PoP's edgelimit_global_share at an instant of the run.
type sharePoint struct {
	at    time.Duration // since the run's start
	pop   string
	share float64
}

// runScenario drives the scenario's traffic with `edgelimit load` inside
// the PoPs' namespaces from a whole second on, takes regions' links down and
// up as its partitions say, watches every PoP's global share meanwhile, and
// measures.
func (l *lab) runScenario(ctx context.Context) (Report, error) {
	sc := l.plan.Scenario
	unit, err := rules.ParseUnit(sc.Limit.Unit)
	if err != nil {
		return Report{}, err
	}
	t0 := time.Now().Truncate(time.Second).Add(2 * time.Second)
	rep := Report{Scenario: sc.Name, Seed: sc.Seed, Limit: sc.Limit.RequestsPerUnit, Window: unit.Duration(),
		Duration: sc.Duration, PoPs: l.popCount(), Servers: len(l.pops()), Regions: len(l.plan.Regions), Direct: sc.Direct,
		Layout: l.plan.Layout.String(), Start: t0}
	l.logf("scenario %s from %s: %v of traffic, %d loads, %d partitions",
		sc.Name, t0.UTC().Format("15:04:05"), sc.Duration, len(l.plan.Loads), len(sc.Partitions))

	var wg sync.WaitGroup
	errs := make(chan error, len(l.plan.Loads)+2*len(sc.Partitions))
	loads := make([]*Proc, len(l.plan.Loads))
	for i, lp := range l.plan.Loads {
		wg.Go(func() {
			if sleep(ctx, time.Until(t0.Add(lp.Start))) != nil {
				return
			}
			p, err := l.start(lp.PoP, fmt.Sprintf("load-%s-%s", lp.PoP.Name, lp.Source), nil, l.cfg.Edgelimit,
				"load", "--url", fmt.Sprintf("http://127.0.0.1:%d", popPort), "--domain", Domain, "--key", Key,
				"-c", strconv.Itoa(loadConns), "-d", (lp.End - lp.Start).String(),
				"--rate", strconv.FormatFloat(lp.Rate, 'f', 3, 64), "--timeline", "--json",
				"--seed", strconv.Itoa(i+1))
			if err != nil {
				errs <- err
				return
			}
			loads[i] = p
			<-p.done
		})
	}
	for _, pt := range sc.Partitions {
		r, _ := l.plan.Region(l.plan.cutRegion(pt))
		res := PartitionResult{Region: r.Name, Cut: pt.Start, Heal: pt.End, Reduced: -1, Restored: -1}
		rep.Partitions = append(rep.Partitions, res)
		wg.Go(func() {
			if sleep(ctx, time.Until(t0.Add(pt.Start))) != nil {
				return
			}
			l.logf("cut: %s's wan link down at %v", r.Name, pt.Start)
			if err := cut(r); err != nil {
				errs <- err
				return
			}
			if sleep(ctx, time.Until(t0.Add(pt.End))) != nil {
				return
			}
			l.logf("heal: %s's wan link up at %v", r.Name, pt.End)
			if err := heal(r); err != nil {
				errs <- err
			}
		})
	}
	// Watch every PoP's share until traffic ends and a few seconds after,
	// so a heal near the end is seen restored.
	var shares []sharePoint
	watchEnd := t0.Add(sc.Duration + 2*sc.UnreachableAfter)
	if len(sc.Partitions) == 0 {
		watchEnd = t0.Add(sc.Duration)
	}
	for time.Now().Before(watchEnd) && ctx.Err() == nil {
		for _, h := range l.pops() {
			if m, err := l.scrape(h); err == nil {
				shares = append(shares, sharePoint{at: time.Since(t0), pop: h.Name, share: m.get("edgelimit_global_share")})
			}
		}
		_ = sleep(ctx, 200*time.Millisecond)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return rep, err
	}
	if err := ctx.Err(); err != nil {
		return rep, err
	}

	// Admissions per window, from every load's timeline.
	var reports []loadgen.Report
	for _, p := range loads {
		r, err := readLoad(p)
		if err != nil {
			return rep, err
		}
		if r.Errors > 0 {
			l.logf("%s: %d errors (last: %s)", p.Name, r.Errors, r.LastError)
		}
		rep.LoadErrors += r.Errors
		reports = append(reports, r)
	}
	rep.Windows = windows(reports, t0, rep.Window, sc.Duration)
	rep.summarize()
	for i := range rep.Partitions {
		rep.Partitions[i].measure(shares, l.plan, sc.UnreachableAfter)
	}
	// How fast mitigation bits traveled: each PoP's quantiles since it
	// started (replication's summary), the slowest PoP's.
	for _, h := range l.pops() {
		m, err := l.scrape(h)
		if err != nil {
			return rep, err
		}
		for q, dst := range map[string]*time.Duration{"0.5": &rep.BitP50, "0.99": &rep.BitP99} {
			v := m.get(`edgelimit_mitigation_propagation_seconds{quantile="` + q + `"}`)
			if v >= 0 && !math.IsNaN(v) {
				*dst = max(*dst, time.Duration(v*float64(time.Second)))
			}
		}
		rep.BitsReceived += int64(max(m.get("edgelimit_mitigation_bits_received_total"), 0))
		rep.HotBatches += int64(max(m.get("edgelimit_replication_hot_batches_total"), 0))
		rep.DirectBatches += int64(max(m.get("edgelimit_replication_direct_batches_total"), 0))
	}
	return rep, nil
}

// windows adds up the loads' timelines into the scenario's windows of
// length window from t0 (windows are aligned to the Unix epoch, as the
// PoPs align them; t0 is a whole second).
func windows(reports []loadgen.Report, t0 time.Time, window, duration time.Duration) []Window {
	ws := int64(max(window/time.Second, 1))
	n := int((duration + window - 1) / window)
	out := make([]Window, n)
	first := t0.Unix() - t0.Unix()%ws
	for i := range out {
		out[i].Start = time.Unix(first+int64(i)*ws, 0).Sub(t0)
	}
	for _, r := range reports {
		for _, s := range r.Timeline {
			i := int((s.Unix - first) / ws)
			if i < 0 || i >= n {
				continue
			}
			out[i].Admitted += s.Allowed
			out[i].Offered += s.Allowed + s.Denied
		}
	}
	return out
}

// measure finds, in the PoPs' share samples, how long after the cut every
// PoP of either side enforced a reduced share, and how long after the heal
// every PoP was back at the whole limit.
func (pr *PartitionResult) measure(shares []sharePoint, p Plan, unreachable time.Duration) {
	reduced := map[string]time.Duration{}
	for _, s := range shares {
		if s.at >= pr.Cut && s.at < pr.Heal && s.share >= 0 && s.share < 1 {
			if _, ok := reduced[s.pop]; !ok {
				reduced[s.pop] = s.at - pr.Cut
			}
		}
	}
	pops := 0
	for _, r := range p.Regions {
		pops += len(r.PoPs)
	}
	if len(reduced) == pops {
		pr.Reduced = 0
		for _, d := range reduced {
			pr.Reduced = max(pr.Reduced, d)
		}
	}
	// Restored: the first sample after the heal from which every PoP's
	// share stays 1.
	last := map[string]time.Duration{}
	for _, s := range shares {
		if s.at >= pr.Heal && s.share != 1 {
			last[s.pop] = s.at
		}
	}
	var latest time.Duration
	seenAfter := false
	for _, s := range shares {
		if s.at >= pr.Heal {
			seenAfter = true
		}
	}
	for _, at := range last {
		latest = max(latest, at)
	}
	if seenAfter && (len(last) == 0 || latest < shares[len(shares)-1].at-unreachable/2) {
		pr.Restored = max(latest-pr.Heal, 0)
	}
}
