package grpcapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/httpapi"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// dupRules is domain "dup": ten 10/min, one 1/min, three 3/min, pair 10/min
// and 2/s (two limits of one descriptor), region 5/min at region scope,
// global 4/min at global scope.
func dupRules(t testing.TB) *rules.Set {
	l := func(path string, n int64, u rules.Unit, scope limit.Scope) *rules.Limit {
		return &rules.Limit{Domain: "dup", Path: path, Name: path, Unit: u, Scope: scope,
			Spec: limit.Spec{Algorithm: limit.SlidingWindow, Limit: n, Window: int64(u.Duration())}}
	}
	root := &rules.Node{}
	root.Child("ten", "").Add(l("ten", 10, rules.Minute, limit.ScopePOP))
	root.Child("one", "").Add(l("one", 1, rules.Minute, limit.ScopePOP))
	root.Child("three", "").Add(l("three", 3, rules.Minute, limit.ScopePOP))
	root.Child("pair", "").Add(l("pair.minute", 10, rules.Minute, limit.ScopePOP), l("pair.second", 2, rules.Second, limit.ScopePOP))
	root.Child("region", "").Add(l("region", 5, rules.Minute, limit.ScopeRegion))
	root.Child("global", "").Add(l("global", 4, rules.Minute, limit.ScopeGlobal))
	set, err := rules.NewSet(rules.NewDomain("dup", "test", root))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// dupDesc is one descriptor of a duplicates case: key:value, and its own
// hits_addend when hits >= 0.
type dupDesc struct {
	key  string
	hits int64
}

func dd(key string) dupDesc           { return dupDesc{key, -1} }
func dh(key string, h int64) dupDesc  { return dupDesc{key, h} }
func ds(descs ...dupDesc) []dupDesc   { return descs }
func ws(sts ...dupStatus) []dupStatus { return sts }
func ok(remaining uint32) dupStatus   { return dupStatus{"OK", remaining} }
func over(remaining uint32) dupStatus { return dupStatus{"OVER_LIMIT", remaining} }

type dupStatus struct {
	Code      string
	Remaining uint32
}

type dupStep struct {
	descs   []dupDesc
	hits    uint32 // the request's hits_addend; 0 is 1
	overall string
	want    []dupStatus
}

// dupCases: duplicate descriptors in one request are each charged, and a
// later occurrence of a key sees the earlier ones' hits, as Envoy's ratelimit
// counts them (one INCRBY per descriptor, in order); its statuses say which
// occurrence does not fit. By default a denied request spends nothing, so an
// occurrence reports the room the key had; with countDenied (the peer's way)
// the hits are spent and the remaining is the peer's. Each case's later steps
// show what the first spent.
var dupCases = []struct {
	name        string
	countDenied bool
	steps       []dupStep
}{
	{"same descriptor twice", false, []dupStep{
		{ds(dd("ten"), dd("ten")), 0, "OK", ws(ok(9), ok(8))},
		{ds(dd("ten")), 0, "OK", ws(ok(7))},
	}},
	{"same descriptor twice, request hits 3", false, []dupStep{
		{ds(dd("ten"), dd("ten")), 3, "OK", ws(ok(7), ok(4))},
		{ds(dd("ten")), 0, "OK", ws(ok(3))},
	}},
	{"twice on a limit of 1", false, []dupStep{
		{ds(dd("one"), dd("one")), 0, "OVER_LIMIT", ws(ok(1), over(1))},
		{ds(dd("one")), 0, "OK", ws(ok(0))}, // the denied pair spent nothing
	}},
	{"hits 1 and 10 on a limit of 10", false, []dupStep{
		{ds(dh("ten", 1), dh("ten", 10)), 0, "OVER_LIMIT", ws(ok(10), over(10))},
		{ds(dh("ten", 10)), 0, "OK", ws(ok(0))},
	}},
	{"hits 1 and 10 on a limit of 10, denied hits counted", true, []dupStep{
		{ds(dh("ten", 1), dh("ten", 10)), 0, "OVER_LIMIT", ws(ok(9), over(0))},
		{ds(dd("ten")), 0, "OVER_LIMIT", ws(over(0))},
	}},
	{"hits 10 and 1 on a limit of 10", false, []dupStep{
		{ds(dh("ten", 10), dh("ten", 1)), 0, "OVER_LIMIT", ws(ok(10), over(10))},
	}},
	{"three occurrences", false, []dupStep{
		{ds(dd("three"), dd("three"), dd("three")), 0, "OK", ws(ok(2), ok(1), ok(0))},
		{ds(dd("three")), 0, "OVER_LIMIT", ws(over(0))},
	}},
	{"three occurrences, the third over", false, []dupStep{
		{ds(dd("three"), dh("three", 2), dd("three")), 0, "OVER_LIMIT", ws(ok(3), ok(3), over(3))},
		{ds(dd("three"), dh("three", 2)), 0, "OK", ws(ok(2), ok(0))},
	}},
	{"three occurrences, denied hits counted", true, []dupStep{
		{ds(dd("three"), dh("three", 2), dd("three")), 0, "OVER_LIMIT", ws(ok(2), ok(0), over(0))},
		{ds(dd("three")), 0, "OVER_LIMIT", ws(over(0))},
	}},
	{"duplicates across two different keys", false, []dupStep{
		{ds(dd("ten"), dd("three"), dd("ten"), dd("three")), 2, "OVER_LIMIT", ws(ok(10), ok(3), ok(10), over(3))},
		// The denial spent nothing of ten either: the request is all or nothing.
		{ds(dd("ten"), dd("three")), 0, "OK", ws(ok(9), ok(2))},
	}},
	{"a duplicate beside a descriptor that denies", false, []dupStep{
		{ds(dd("ten"), dd("ten"), dh("one", 2)), 0, "OVER_LIMIT", ws(ok(10), ok(10), over(1))},
		{ds(dd("ten")), 0, "OK", ws(ok(9))},
	}},
	{"a duplicate beside a descriptor over its limit, different hits", false, []dupStep{
		{ds(dh("three", 3)), 0, "OK", ws(ok(0))},
		// ten counts 2 hits and three 1: two store steps, the denying one first.
		{ds(dd("ten"), dd("ten"), dd("three")), 0, "OVER_LIMIT", ws(ok(10), ok(10), over(0))},
		{ds(dd("ten")), 0, "OK", ws(ok(9))},
	}},
	{"a duplicate beside another descriptor", false, []dupStep{
		{ds(dd("ten"), dd("three"), dd("ten")), 0, "OK", ws(ok(9), ok(2), ok(8))},
	}},
	{"twice on a descriptor with two limits", false, []dupStep{
		{ds(dd("pair"), dd("pair")), 0, "OK", ws(ok(1), ok(0))}, // 2/s is the most pressing: 1, then 0 left
		{ds(dd("pair"), dd("pair")), 0, "OVER_LIMIT", ws(over(0), over(0))},
		{ds(dd("pair")), 0, "OVER_LIMIT", ws(over(0))},
	}},
	{"twice on two limits, the second over", false, []dupStep{
		{ds(dd("pair"), dh("pair", 2)), 0, "OVER_LIMIT", ws(ok(2), over(2))},
	}},
	{"region limit", false, []dupStep{
		{ds(dd("region"), dd("region")), 2, "OK", ws(ok(3), ok(1))},
		{ds(dd("region"), dd("region")), 0, "OVER_LIMIT", ws(ok(1), over(1))},
		{ds(dd("region")), 0, "OK", ws(ok(0))},
	}},
	{"global limit", false, []dupStep{
		{ds(dd("global"), dd("global"), dd("global")), 0, "OK", ws(ok(3), ok(2), ok(1))},
		{ds(dd("global"), dd("global")), 0, "OVER_LIMIT", ws(ok(1), over(1))},
	}},
}

// dupProtocol sends a request over one of the PoP's APIs and returns its
// overall code and statuses.
type dupProtocol struct {
	name string
	send func(t *testing.T, r *rlsv3.RateLimitRequest) (string, []dupStatus)
}

// dupServe serves eng over gRPC, /json and /v1/check at the instant now.
func dupServe(t *testing.T, eng *pop.Engine, now time.Time) []dupProtocol {
	clock := func() time.Time { return now }
	srv := New(Config{Engine: eng, Now: clock})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	srv.SetServing(true)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/json", NewJSONHandler(Config{Engine: eng, Now: clock}))
	mux.Handle("/", httpapi.New(httpapi.Config{Engine: eng, DecodeProto: DecodeJSON, Now: clock}))
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		hs.Close()
		conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Stop(ctx)
	})
	client := rlsv3.NewRateLimitServiceClient(conn)
	grpcSend := func(t *testing.T, r *rlsv3.RateLimitRequest) (string, []dupStatus) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		resp, err := client.ShouldRateLimit(ctx, r)
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return envoyStatuses(resp)
	}
	jsonSend := func(t *testing.T, r *rlsv3.RateLimitRequest) (string, []dupStatus) {
		t.Helper()
		body, err := protojson.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		_, b := postRaw(t, hs.URL+"/json", string(body))
		return envoyStatuses(strict(t, b))
	}
	checkSend := func(t *testing.T, r *rlsv3.RateLimitRequest) (string, []dupStatus) {
		t.Helper()
		body, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		body = quoted64.ReplaceAll(body, []byte(`"hits_addend":$1`))
		resp, b := postRaw(t, hs.URL+"/v1/check", string(body))
		var h struct {
			OverallCode string `json:"overall_code"`
			Statuses    []struct {
				Code           string `json:"code"`
				LimitRemaining uint32 `json:"limit_remaining"`
			} `json:"statuses"`
		}
		if err := json.Unmarshal(b, &h); err != nil {
			t.Fatalf("/v1/check: HTTP %d: %v: %s", resp.StatusCode, err, b)
		}
		var sts []dupStatus
		for _, s := range h.Statuses {
			sts = append(sts, dupStatus{s.Code, s.LimitRemaining})
		}
		return h.OverallCode, sts
	}
	return []dupProtocol{{"grpc", grpcSend}, {"json", jsonSend}, {"v1check", checkSend}}
}

func envoyStatuses(resp *rlsv3.RateLimitResponse) (string, []dupStatus) {
	var sts []dupStatus
	for _, s := range resp.Statuses {
		sts = append(sts, dupStatus{s.Code.String(), s.LimitRemaining})
	}
	return resp.OverallCode.String(), sts
}

// TestDuplicateDescriptors runs dupCases over gRPC, /json and /v1/check,
// against the embedded store and a real redis-server.
func TestDuplicateDescriptors(t *testing.T) {
	now := t0
	stores := []struct {
		name string
		open func(t *testing.T) pop.Store
	}{
		{"memory", func(t *testing.T) pop.Store { return store.NewMemory(store.MemoryConfig{}) }},
		{"redis", func(t *testing.T) pop.Store {
			srv := redistest.Start(t)
			s, err := store.OpenRedis(store.RedisConfig{URL: srv.URL(), ClockSource: store.ClockLocal, Timeout: within})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			eng := pop.NewEngine(st.open(t), dupRules(t), nil)
			for _, p := range dupServe(t, eng, now) {
				t.Run(p.name, func(t *testing.T) {
					for ci, c := range dupCases {
						eng.SetCountDenied(c.countDenied)
						// A value of its own per case and protocol: the store's
						// keys outlive the subtest.
						value := fmt.Sprintf("%s-%d", p.name, ci)
						for si, step := range c.steps {
							r := &rlsv3.RateLimitRequest{Domain: "dup", HitsAddend: step.hits}
							for _, d := range step.descs {
								rd := desc(d.key, value)
								if d.hits >= 0 {
									rd.HitsAddend = wrapperspb.UInt64(uint64(d.hits))
								}
								r.Descriptors = append(r.Descriptors, rd)
							}
							overall, sts := p.send(t, r)
							if overall != step.overall || !equalStatuses(sts, step.want) {
								t.Errorf("%s, step %d (%s): got %s %v, want %s %v", c.name, si, describe(step.descs), overall, sts, step.overall, step.want)
							}
						}
					}
					eng.SetCountDenied(false)
				})
			}
		})
	}
}

func equalStatuses(a, b []dupStatus) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func describe(descs []dupDesc) string {
	var parts []string
	for _, d := range descs {
		if d.hits >= 0 {
			parts = append(parts, fmt.Sprintf("%s×%d", d.key, d.hits))
		} else {
			parts = append(parts, d.key)
		}
	}
	return strings.Join(parts, ", ")
}
