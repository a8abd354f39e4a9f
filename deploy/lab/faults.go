package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// runFaults injects, one after the other, the faults an operator must
// survive, and checks what follows each:
//
//  1. a PoP killed with kill -9 and started again on its data: it must be
//     ready again, still hold what it counted before the kill (an hour-long
//     limit's remaining), and apply the other PoPs' batches again;
//  2. the first hub NATS server stopped: every PoP must keep hearing every
//     region, and the other regions' batches must keep arriving by the
//     stream.
func (l *lab) runFaults(ctx context.Context) []FaultResult {
	var out []FaultResult
	hub := l.plan.Regions[0]

	victim := hub.PoPs[len(hub.PoPs)-1]
	const hits = 30
	for range hits {
		l.check(victim, durableKey, "before-kill", 1)
	}
	// Past a flush: what the PoP counted is saved before it is published.
	_ = sleep(ctx, 3*l.plan.Scenario.FlushInterval+200*time.Millisecond)
	t := time.Now()
	l.mu.Lock()
	p := l.procs[victim.Name]
	l.mu.Unlock()
	p.Kill()
	l.logf("fault: %s killed with kill -9", victim.Name)
	err := l.startPoP(victim)
	if err == nil {
		err = l.waitFor(ctx, 60*time.Second, victim.Name+" ready after kill -9", l.ready(victim))
	}
	detail := ""
	if err == nil {
		rem, cerr := l.check(victim, durableKey, "before-kill", 0)
		detail = fmt.Sprintf("remaining %d of %d after %d hits", rem, durableLimit, hits)
		if cerr != nil {
			err = cerr
		} else if rem > durableLimit-hits {
			err = fmt.Errorf("forgot its counts: %s", detail)
		}
	}
	if err == nil {
		m0, _ := l.scrape(victim)
		err = l.waitFor(ctx, 30*time.Second, victim.Name+" applies the others' batches again", func() error {
			for _, o := range l.pops() {
				if o != victim {
					l.check(o, Key, "after-restart", 1)
				}
			}
			m, err := l.scrape(victim)
			if err != nil {
				return err
			}
			if len(l.pops()) == 1 {
				return nil
			}
			if v := m.get("edgelimit_replication_applied_batches_total"); v <= max(m0.get("edgelimit_replication_applied_batches_total"), 0) {
				return fmt.Errorf("applied batches %v", v)
			}
			return nil
		})
	}
	fr := result("kill -9 "+victim.Name+", restart: counts kept, replicating", t, err)
	if fr.OK {
		fr.Detail = detail
	}
	out = append(out, fr)

	s := hub.NATS[0]
	t = time.Now()
	l.mu.Lock()
	p = l.procs[s.Name]
	l.mu.Unlock()
	p.Terminate()
	l.logf("fault: %s stopped", s.Name)
	// Counts from other PoPs arrive by three paths: the stream (batches),
	// core NATS while stream sourcing stalls (direct), and snapshots.
	heard := func(m metrics) float64 {
		return m.get("edgelimit_replication_applied_batches_total") + m.get("edgelimit_replication_direct_batches_total") +
			m.get("edgelimit_replication_applied_snapshots_total")
	}
	before := map[string]metrics{}
	for _, h := range l.pops() {
		if m, err := l.scrape(h); err == nil {
			before[h.Name] = m
		}
	}
	// Traffic on a key of its own at every PoP, so that every PoP has
	// batches to publish; each must keep hearing the others and every region.
	err = nil
	for _, h := range l.pops() {
		if err = l.waitFor(ctx, 30*time.Second, h.Name+" hears the others with "+s.Name+" down", func() error {
			for _, o := range l.pops() {
				l.check(o, Key, "after-hub-stop", 1)
			}
			m, err := l.scrape(h)
			if err != nil {
				return err
			}
			if v := m.get("edgelimit_global_share"); v != 1 {
				return fmt.Errorf("global share %v", v)
			}
			if v, v0 := heard(m), heard(before[h.Name]); v <= v0 {
				return fmt.Errorf("batches and snapshots applied %v, %v before the stop", v, v0)
			}
			return nil
		}); err != nil {
			break
		}
	}
	// Whether the stream path itself survived: a region's stream has one
	// replica (deploy/README.md, "Known limits"), so it stops with the
	// server that holds it.
	var stalled []string
	if err == nil {
		_ = sleep(ctx, 2*time.Second)
		for _, h := range l.pops() {
			m, serr := l.scrape(h)
			if serr == nil && m.get("edgelimit_replication_applied_batches_total") <= before[h.Name].get("edgelimit_replication_applied_batches_total") {
				stalled = append(stalled, h.Name)
			}
		}
	}
	fr = result("stop "+s.Name+": regions still linked", t, err)
	if len(stalled) > 0 {
		fr.Detail = "no stream batches since at " + strings.Join(stalled, ", ") + " (their region's stream was on " + s.Name + ")"
	}
	out = append(out, fr)
	return out
}
func result(what string, t time.Time, err error) FaultResult {
	r := FaultResult{What: what, OK: err == nil, Took: time.Since(t)}
	if err != nil {
		r.Detail = err.Error()
	}
	return r
}

// shareIs checks h's global share.
func (l *lab) shareIs(h Host, want float64) func() error {
	return func() error {
		m, err := l.scrape(h)
		if err != nil {
			return err
		}
		if v := m.get("edgelimit_global_share"); v != want {
			return fmt.Errorf("global share %v, want %v", v, want)
		}
		return nil
	}
}

// check sends one check of key=value with hits to h and returns the
// remaining of its limit.
func (l *lab) check(h Host, key, value string, hits int) (int64, error) {
	body := fmt.Sprintf(`{"domain":%q,"descriptors":[{"entries":[{"key":%q,"value":%q}]}],"hits_addend":%d}`, Domain, key, value, hits)
	resp, err := l.client.Post(fmt.Sprintf("http://%s:%d/v1/check", h.IP, popPort), "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Statuses []struct {
			LimitRemaining int64 `json:"limit_remaining"`
		} `json:"statuses"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || len(r.Statuses) != 1 {
		return 0, fmt.Errorf("check on %s: %s, statuses %v (%v)", h.Name, resp.Status, r.Statuses, err)
	}
	return r.Statuses[0].LimitRemaining, nil
}
