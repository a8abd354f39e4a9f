package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/edgelimit/edgelimit/pop/quota"
	"github.com/edgelimit/edgelimit/pop/quota/pgtest"
)

// quotaRules: the tier limit of acme is what the tests read back.
const quotaRules = `domain: q
tenants:
  key: api_key
  default_tier: free
  tiers:
    - name: free
      rate_limit: {unit: minute, requests_per_unit: 5}
    - name: pro
      rate_limit: {unit: minute, requests_per_unit: 50}
`

func writeQuotaFiles(t *testing.T) (rules, token string) {
	dir := t.TempDir()
	rules, token = filepath.Join(dir, "rules.yaml"), filepath.Join(dir, "token")
	if err := os.WriteFile(rules, []byte(quotaRules), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(token, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return rules, token
}

func adminPut(t *testing.T, adminAddr, key, body string) {
	t.Helper()
	req, _ := http.NewRequest("PUT", "http://"+adminAddr+"/admin/v1/quotas/"+key, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 && resp.StatusCode != 201 {
		t.Fatalf("PUT %s: %d", key, resp.StatusCode)
	}
}

// limitOf asks a PoP, with a check that counts nothing, which quota its tier
// limit holds for key now.
func limitOf(client *http.Client, addr, key string) (int64, error) {
	body := `{"domain":"q","descriptors":[{"entries":[{"key":"api_key","value":"` + key + `"}],"hits_addend":0}]}`
	resp, err := client.Post("http://"+addr+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		Statuses []struct {
			CurrentLimit struct {
				RequestsPerUnit int64 `json:"requests_per_unit"`
			} `json:"current_limit"`
		} `json:"statuses"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Statuses) == 0 {
		return 0, fmt.Errorf("check answer: %v", err)
	}
	return out.Statuses[0].CurrentLimit.RequestsPerUnit, nil
}

func createDB(t *testing.T, serverURL, name string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), serverURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
}

// A PoP restarted while PostgreSQL is down still enforces the overrides it
// last saw (its snapshot under --data), and follows PostgreSQL again once it
// is back.
func TestPoPQuotasSurvivePostgresDown(t *testing.T) {
	bin := buildBinary(t)
	pg := pgtest.NewCluster(t)
	createDB(t, pg.URL("postgres"), "quotas")
	rules, token := writeQuotaFiles(t)
	data := t.TempDir()
	listen, admin := freeAddr(t), freeAddr(t)
	args := []string{"--listen", listen, "--rules", rules, "--data", data, "--quotas", pg.URL("quotas"),
		"--admin-listen", admin, "--admin-token-file", token, "--quotas-poll", "500ms"}
	p := startPoP(t, bin, args...)
	adminPut(t, admin, "acme", `{"tier":"pro","overrides":[{"descriptor":"tier:pro","requests_per_unit":7,"unit":"minute"}]}`)
	waitLimit(t, listen, "acme", 7)
	snap := filepath.Join(data, "quotas-snapshot.bin")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if qs, _, err := quota.ReadSnapshot(snap); err == nil && len(qs) == 1 && qs[0].Override("tier:pro") != nil && qs[0].Override("tier:pro").RequestsPerUnit == 7 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no snapshot with the override on disk after 5s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = p.Process.Kill() // kill -9
	_, _ = p.Process.Wait()
	pg.Stop()

	start := time.Now()
	startPoP(t, bin, args...)
	t.Logf("PoP restarted with PostgreSQL down in %v", time.Since(start).Round(time.Millisecond))
	if got, err := limitOf(http.DefaultClient, listen, "acme"); err != nil || got != 7 {
		t.Fatalf("after a restart with PostgreSQL down, acme's limit is %d (%v), want the override's 7", got, err)
	}
	// Its 7 hits are enforced, not the free tier's 5 nor pro's 50.
	allowed := 0
	for range 10 {
		if popCheckKey(t, listen, "acme") == 200 {
			allowed++
		}
	}
	if allowed != 7 {
		t.Fatalf("acme got %d hits with PostgreSQL down, want its override's 7", allowed)
	}
	// PostgreSQL back: a change made now reaches the PoP.
	pg.Start()
	adminPut(t, admin, "acme", `{"tier":"pro","overrides":[{"descriptor":"tier:pro","requests_per_unit":9,"unit":"minute"}]}`)
	waitLimit(t, listen, "acme", 9)
}

func popCheckKey(t *testing.T, addr, key string) int {
	t.Helper()
	body := `{"domain":"q","descriptors":[{"entries":[{"key":"api_key","value":"` + key + `"}]}]}`
	resp, err := http.Post("http://"+addr+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func waitLimit(t *testing.T, addr, key string, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := limitOf(http.DefaultClient, addr, key)
		if err == nil && got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s's limit is %d (%v), want %d after 10s", addr, key, got, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A quota change made at one PoP's admin API is in force at every PoP of
// `edgelimit demo` (three regions, two PoPs each, all on one PostgreSQL)
// within a second: the p99 over 100 changes. Each region's PoPs read
// PostgreSQL themselves (LISTEN/NOTIFY), so the time is PostgreSQL's
// notification plus one read, whatever the region.
func TestDemoQuotaPropagation(t *testing.T) {
	bin := buildBinary(t)
	url := pgtest.Database(t)
	rules, token := writeQuotaFiles(t)
	dir := t.TempDir()
	port := freeBase(t, 6)
	cmd := exec.Command(bin, "demo", "--rules", rules, "--regions", "eu,us,ap", "--pops", "2", "--base-port", port,
		"--data", filepath.Join(dir, "demo"), "--quotas", url, "--admin-token-file", token)
	cmd.Env = demoEnv()
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
		}
	}()
	sc := bufio.NewScanner(stdout)
	var pops, admins []string
	for len(pops) < 6 && sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 {
			t.Fatalf("demo line %q: want region, pop, check URL, admin URL", sc.Text())
		}
		pops = append(pops, strings.TrimPrefix(f[2], "http://"))
		admins = append(admins, strings.TrimPrefix(f[3], "http://"))
	}
	if len(pops) != 6 {
		t.Fatalf("demo printed %d PoPs; stderr:\n%s", len(pops), stderr.String())
	}
	for _, a := range pops {
		waitReady(t, a, &stderr)
	}
	adminPut(t, admins[0], "acme", `{"tier":"pro"}`)
	for _, a := range pops {
		waitLimit(t, a, "acme", 50)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	var lat []time.Duration
	for i := range 100 {
		want := int64(1000 + i)
		start := time.Now()
		adminPut(t, admins[i%len(admins)], "acme", fmt.Sprintf(`{"tier":"pro","overrides":[{"descriptor":"tier:pro","requests_per_unit":%d,"unit":"minute"}]}`, want))
		var wg sync.WaitGroup
		var mu sync.Mutex
		worst := time.Duration(0)
		for _, a := range pops {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Since(start) < 5*time.Second {
					if got, err := limitOf(client, a, "acme"); err == nil && got == want {
						mu.Lock()
						worst = max(worst, time.Since(start))
						mu.Unlock()
						return
					}
					time.Sleep(2 * time.Millisecond)
				}
				mu.Lock()
				worst = max(worst, 5*time.Second)
				mu.Unlock()
			}()
		}
		wg.Wait()
		lat = append(lat, worst)
	}
	slices.Sort(lat)
	p50, p99, maxL := lat[49], lat[98], lat[99]
	t.Logf("quota change visible at all 6 PoPs (3 regions) after the PUT returned: p50 %v, p99 %v, max %v (100 changes)", p50, p99, maxL)
	if p99 > time.Second {
		t.Fatalf("p99 %v > 1s", p99)
	}
}

func waitReady(t *testing.T, addr string, stderr *strings.Builder) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready; stderr:\n%s", addr, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
