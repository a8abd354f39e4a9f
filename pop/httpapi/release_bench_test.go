package httpapi

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
)

// BenchmarkHandlerConcurrency is the HTTP handler in process, over 4096
// keys: "rate" is a check of a rate limit alone; "rate+concurrency" is a
// check of the same rate limit plus a concurrency limit — which takes a
// lease — followed by the POST /v1/release of that lease, the pair a
// request holding a slot costs; "rate+concurrency/check" is the check alone
// (its leases expire unreleased after a second).
func BenchmarkHandlerConcurrency(b *testing.B) {
	for _, c := range []struct {
		name    string
		conc    bool
		release bool
	}{{"rate", false, false}, {"rate+concurrency", true, true}, {"rate+concurrency/check", true, false}} {
		root := &rules.Node{}
		n := root.Child("api_key", "")
		n.Add(lim("api_key", 1<<40, rules.Second, "default"))
		if c.conc {
			n.Add(&rules.Limit{Domain: "edge", Path: "api_key", Name: "in_flight", LeaseTTL: time.Second,
				Spec: limit.Spec{Limit: 1 << 30, Window: int64(time.Second)}})
		}
		set, _ := rules.NewSet(rules.NewDomain("edge", "bench", root))
		eng := pop.NewEngine(store.NewMemory(store.MemoryConfig{}), set, nil)
		eng.UseLeases(store.NewLeases())
		h := New(Config{Engine: eng})
		bodies := make([]string, 4096)
		for i := range bodies {
			bodies[i] = fmt.Sprintf(`{"domain":"edge","descriptors":[{"entries":[{"key":"api_key","value":"k%d"}]}],"hits_addend":1}`, i)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				w := &discard{h: http.Header{}}
				r := httptest.NewRequest("POST", "/v1/check", nil)
				rel := httptest.NewRequest("POST", "/v1/release", nil)
				i := 0
				for pb.Next() {
					body := bodies[i%len(bodies)]
					r.Body, r.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
					clear(w.h)
					h.ServeHTTP(w, r)
					if c.conc {
						lease := w.h.Get(pop.LeaseHeader)
						if lease == "" {
							b.Fatal("no lease")
						}
						if c.release {
							rb := `{"lease_id":"` + lease + `"}`
							rel.Body, rel.ContentLength = io.NopCloser(strings.NewReader(rb)), int64(len(rb))
							h.ServeHTTP(w, rel)
						}
					}
					i++
				}
			})
		})
	}
}
