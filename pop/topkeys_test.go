package pop

import (
	"context"
	"fmt"
	"testing"

	"github.com/edgelimit/edgelimit/pop/topkeys"
)

// BenchmarkTopKeysCost is what counting denied keys in the top-keys sketch
// costs a check, side by side with the sketch off: a key denied by the
// store (over its limit of 1) and an allowed key (which the sketch never
// sees), over 16 keys.
func BenchmarkTopKeysCost(b *testing.B) {
	for _, c := range []struct {
		name  string
		limit int64
	}{{"denied", 1}, {"allowed", 1 << 40}} {
		for _, top := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/top=%v", c.name, top), func(b *testing.B) {
				e, _, _ := mitigatedPoP(b, "a", c.limit, 0)
				e.UseMitigations(nil) // the store decides every check
				if top {
					e.UseTopKeys(topkeys.New(100))
				}
				reqs := make([]*Request, 16)
				for i := range reqs {
					reqs[i] = req(1, []string{"ip", fmt.Sprintf("10.0.0.%d", i)})
				}
				ctx := context.Background()
				var res Result
				for _, r := range reqs {
					_ = e.CheckAt(ctx, t0, r, &res)
				}
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					var res Result
					for i := 0; pb.Next(); i++ {
						_ = e.CheckAt(ctx, t0, reqs[i&15], &res)
					}
				})
			})
		}
	}
}

// TestTopKeysCountsDenials: the engine counts every denial of a key in the
// sketch and no admission.
func TestTopKeysCountsDenials(t *testing.T) {
	e, _, _ := mitigatedPoP(t, "a", 2, 0)
	e.UseMitigations(nil)
	top := topkeys.New(4)
	e.UseTopKeys(top)
	ctx := context.Background()
	var res Result
	for range 5 {
		if err := e.CheckAt(ctx, t0, req(1, []string{"ip", "x"}), &res); err != nil {
			t.Fatal(err)
		}
	}
	if got := top.Top(-1); len(got) != 1 || got[0].Count != 3 || top.Total() != 3 {
		t.Fatalf("after 2 admissions and 3 denials: %+v (total %d), want one key counted 3", got, top.Total())
	}
}
