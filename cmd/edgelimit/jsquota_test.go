package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const storeQuotaRules = durableRules + `  - key: many
    rate_limit: {unit: hour, requests_per_unit: 1000, scope: region}
`

// checkMany checks n distinct values of the region limit "many" in one
// request: n slots for the PoP to publish, and to snapshot every interval.
func checkMany(t *testing.T, addr string, from, n int) {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"domain":"edge","descriptors":[`)
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"entries":[{"key":"many","value":"value-%08d"}]}`, from+i)
	}
	b.WriteString("]}")
	resp, err := http.Post("http://"+addr+"/v1/check", "application/json", strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// TestPoPJetStreamStoreQuota re-runs probe 3 of issue 27 on a PoP whose
// embedded JetStream store is 1 MiB (--nats-max-store-mib 1), with a second
// PoP of its region on the same server.
//
// First the PoPs publish far more than the store holds (thousands of keys,
// snapshotted every 200 ms): the region's stream, capped at 3/4 of the
// store, discards its oldest messages, so no publish is refused, the PoP
// stays ready and edgelimit_jetstream_store_full stays 0. Before, the stream
// was unbounded, JetStream refused every publish once it reached the store
// limit (insufficient resources), /readyz stayed 200 and nothing said so.
//
// Then something else fills the store (another stream on the same server):
// JetStream refuses the PoP's publishes, and the PoP says so — /readyz 503
// naming JetStream's refusal, edgelimit_jetstream_store_full 1 — while it
// admits on. Once the other stream is gone, the PoP is ready again and the
// other PoP hears what it admitted meanwhile: the two agree on the region
// limit.
func TestPoPJetStreamStoreQuota(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte(storeQuotaRules), 0o644); err != nil {
		t.Fatal(err)
	}
	natsPort := strings.Split(freeAddr(t), ":")[1]
	a, b := freeAddr(t), freeAddr(t)
	common := []string{"--rules", rules, "--region", "eu", "--topology", "eu=a,b", "--flush-interval", "50ms",
		"--snapshot-interval", "200ms", "--nats-max-store-mib", "1", "--log-level", "info"}
	startPoP(t, bin, append([]string{"--listen", a, "--data", filepath.Join(dir, "a"), "--pop", "a", "--nats-allow-anonymous", "--nats-port", natsPort}, common...)...)
	startPoP(t, bin, append([]string{"--listen", b, "--data", filepath.Join(dir, "b"), "--pop", "b",
		"--nats", "nats://127.0.0.1:" + natsPort}, common...)...)

	// Phase 1: the stream fills and discards its oldest messages.
	for i := range 80 { // at most 64 descriptors a request
		checkMany(t, a, i*50, 50)
	}
	max, _ := strconv.ParseFloat(metricValue(t, a, "edgelimit_jetstream_stream_max_bytes"), 64)
	if max <= 0 || max > 1<<20 {
		t.Fatalf("edgelimit_jetstream_stream_max_bytes = %v, want the stream capped under the 1 MiB store", max)
	}
	waitFor(t, "the stream at its cap", 60*time.Second, func() bool {
		v, _ := strconv.ParseFloat(metricValue(t, a, "edgelimit_jetstream_stream_bytes"), 64)
		return v >= max*0.75
	})
	// Several snapshots more (each about a fifth of the stream's cap): every
	// one is stored, the oldest discarded.
	failures0 := metricValue(t, a, "edgelimit_replication_publish_failures_total")
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if v := metricValue(t, a, "edgelimit_jetstream_store_full"); v != "0" {
			t.Fatalf("edgelimit_jetstream_store_full = %q while the stream was at its cap: JetStream refused a publish", v)
		}
		if c, body := getBody(t, "http://"+a+"/readyz"); c != 200 {
			t.Fatalf("a not ready while its stream was at its cap: %d %s", c, body)
		}
	}
	if f := metricValue(t, a, "edgelimit_replication_publish_failures_total"); f != failures0 {
		t.Errorf("publish failures went from %s to %s with the stream at its cap, want none", failures0, f)
	}
	if v, _ := strconv.ParseFloat(metricValue(t, a, "edgelimit_jetstream_stream_bytes"), 64); v > max {
		t.Errorf("stream holds %v bytes, over its cap %v", v, max)
	}

	// Phase 2: another stream fills the store.
	nc, err := nats.Connect("nats://127.0.0.1:" + natsPort)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FILLER", Subjects: []string{"filler"}}); err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 16<<10)
	for i := 0; ; i++ {
		if _, err := js.Publish(ctx, "filler", chunk); err != nil {
			t.Logf("filler stream full after %d KiB: %v", i*16, err)
			break
		}
		if i > 1000 {
			t.Fatal("the filler stream took 16 MiB of a 1 MiB store")
		}
	}
	for i := range 3 {
		if c := checkKey(t, a, "region"); c != 200 {
			t.Fatalf("check %d at a with its JetStream store full: %d, want 200", i+1, c)
		}
		time.Sleep(200 * time.Millisecond)
	}
	body := waitUnready(t, a, "a unready on JetStream's refusals", "JetStream refuses to store", 30*time.Second)
	t.Logf("a with the store full: /readyz 503: %s", strings.TrimSpace(body))
	if v := metricValue(t, a, "edgelimit_jetstream_store_full"); v != "1" {
		t.Errorf("edgelimit_jetstream_store_full = %q with publishes refused, want 1", v)
	}

	if err := js.DeleteStream(ctx, "FILLER"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a ready once the store has room", 60*time.Second, func() bool {
		c, _ := getBody(t, "http://"+a+"/readyz")
		return c == 200
	})
	if v := metricValue(t, a, "edgelimit_jetstream_store_full"); v != "0" {
		t.Errorf("edgelimit_jetstream_store_full = %q once publishes are stored, want 0", v)
	}
	// b hears a's three admissions of the region limit of 5: 2 are left.
	time.Sleep(time.Second)
	got := admittedOf(t, b, "region", 5)
	if got > 2 || got == 0 {
		t.Errorf("b admitted %d of the region limit of 5 after a admitted 3 while JetStream refused its publishes, want 1 or 2", got)
	}
}
