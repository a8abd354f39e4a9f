package replication_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/replication"
	"github.com/edgelimit/edgelimit/replication/natstest"
)

// TestClockAgreement: three PoPs of a region over a real NATS server, one of
// them with a wall clock 400 ms ahead. Through the presence beacons the
// skewed PoP finds it is ahead of the median clock and corrects by about
// −400 ms; the two right ones do not move.
func TestClockAgreement(t *testing.T) {
	c := natstest.StartRegions(t, "eu")
	topo := topology(map[string][]string{"eu": {"fra1", "par1", "ams1"}})
	const skew = 400 * time.Millisecond
	offsets := map[string]*atomic.Int64{}
	for _, name := range []string{"fra1", "par1", "ams1"} {
		off := new(atomic.Int64)
		offsets[name] = off
		startPoP(t, c, topo, "eu", name, nil, func(cfg *replication.Config) {
			cfg.HelloInterval = 100 * time.Millisecond
			cfg.SetClockOffset = func(d time.Duration) { off.Store(int64(d)) }
			if name == "ams1" {
				cfg.Now = func() int64 { return time.Now().Add(skew).UnixNano() }
			}
		})
	}
	const tol = 20 * time.Millisecond
	took, err := waitFor(10*time.Second, func() error {
		if d := time.Duration(offsets["ams1"].Load()) + skew; d > tol || d < -tol {
			return fmt.Errorf("ams1's clock is %v off the others' after its correction of %v", d, time.Duration(offsets["ams1"].Load()))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("after %v: %v", took, err)
	}
	t.Logf("ams1 corrected by %v after %v", time.Duration(offsets["ams1"].Load()), took)
	time.Sleep(500 * time.Millisecond) // more beacons: the right clocks must stay put
	for _, name := range []string{"fra1", "par1"} {
		if d := time.Duration(offsets[name].Load()); d != 0 {
			t.Errorf("%s, whose clock is right, moved it by %v", name, d)
		}
	}
}
