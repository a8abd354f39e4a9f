package lab

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// runFaults injects, one after the other, the faults an operator must
// survive, and checks what follows each:
//
//  1. a PoP killed with kill -9 and started again on its data: it must be
//     ready again and hear every region;
//  2. the first hub NATS server stopped: every PoP must keep hearing every
//     region, and the other regions' batches must keep arriving by the
//     stream.
func (l *lab) runFaults(ctx context.Context) []FaultResult {
	var out []FaultResult
	hub := l.plan.Regions[0]

	victim := hub.PoPs[len(hub.PoPs)-1]
	t := time.Now()
	l.mu.Lock()
	p := l.procs[victim.Name]
	l.mu.Unlock()
	p.kill()
	l.logf("fault: %s killed with kill -9", victim.Name)
	err := l.startPoP(victim)
	if err == nil {
		err = l.waitFor(ctx, 60*time.Second, victim.Name+" ready after kill -9", l.ready(victim))
	}
	if err == nil {
		err = l.waitFor(ctx, 30*time.Second, victim.Name+" hears every region", l.shareIs(victim, 1))
	}
	out = append(out, result("kill -9 "+victim.Name+", restart: ready, share 1", t, err))

	s := hub.NATS[0]
	t = time.Now()
	l.mu.Lock()
	p = l.procs[s.Name]
	l.mu.Unlock()
	p.terminate()
	l.logf("fault: %s stopped", s.Name)
	before := map[string]float64{}
	for _, h := range l.pops() {
		if m, err := l.scrape(h); err == nil {
			before[h.Name] = m.get("edgelimit_replication_applied_batches_total")
		}
	}
	// Traffic on a key of its own at every PoP, so that every PoP has
	// batches to publish; each must apply the others' from its stream.
	err = nil
	for _, h := range l.pops() {
		if err = l.waitFor(ctx, 30*time.Second, h.Name+" applies new batches with "+s.Name+" down", func() error {
			for _, o := range l.pops() {
				l.hit(o, "after-hub-stop")
			}
			m, err := l.scrape(h)
			if err != nil {
				return err
			}
			if v := m.get("edgelimit_global_share"); v != 1 {
				return fmt.Errorf("global share %v", v)
			}
			if v := m.get("edgelimit_replication_applied_batches_total"); v <= before[h.Name] {
				return fmt.Errorf("applied batches %v, %v before the stop", v, before[h.Name])
			}
			return nil
		}); err != nil {
			break
		}
	}
	out = append(out, result("stop "+s.Name+": regions still linked", t, err))
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

// hit sends one check of value to h and ignores the answer.
func (l *lab) hit(h Host, value string) {
	body := fmt.Sprintf(`{"domain":%q,"descriptors":[{"entries":[{"key":%q,"value":%q}]}]}`, Domain, Key, value)
	resp, err := l.client.Post(fmt.Sprintf("http://%s:%d/v1/check", h.IP, popPort), "application/json", strings.NewReader(body))
	if err == nil {
		resp.Body.Close()
	}
}
