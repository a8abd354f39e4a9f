package node

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestRunServesGRPC: with GRPCListen, a PoP serves Envoy's rate limit
// service and gRPC health beside the HTTP API, on the same engine, counts
// the calls in its metrics, keeps to its limits (GRPCMaxConns), and stops
// both on shutdown.
func TestRunServesGRPC(t *testing.T) {
	dir := t.TempDir()
	rf := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rf, []byte(rulesFile("2")), 0o644); err != nil {
		t.Fatal(err)
	}
	grpcReady := make(chan net.Addr, 1)
	base, stop, done := start(t, Config{Rules: []string{rf}, RulesInterval: time.Hour, DataDir: dir, GRPCListen: "127.0.0.1:0", GRPCReady: grpcReady, GRPCMaxConns: 1})
	addr := <-grpcReady
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	if r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", r, err)
	}
	rls := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "ip", Value: "1.2.3.4"}}}}}
	resp, err := rls.ShouldRateLimit(ctx, req)
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("first gRPC check: %v %v", resp, err)
	}
	// The HTTP API decides on the same counts: its hit is the second of 2.
	if code, _ := check(t, base); code != http.StatusOK {
		t.Fatalf("HTTP check: %d", code)
	}
	if resp, err = rls.ShouldRateLimit(ctx, req); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("third check over gRPC: %v %v", resp, err)
	}
	// GRPCMaxConns 1, held by conn: a second connection is closed at once.
	c2, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(2 * time.Minute))
	if n, err := c2.Read(make([]byte, 64)); err == nil {
		t.Errorf("a second gRPC connection past GRPCMaxConns 1 was served (read %d bytes)", n)
	}
	c2.Close()
	if !strings.Contains(string(metricsText(t, base)), `edgelimit_grpc_refused_total{reason="conns"} 1`) {
		t.Error(`metrics lack edgelimit_grpc_refused_total{reason="conns"} 1`)
	}
	body := metricsText(t, base)
	for _, want := range []string{`edgelimit_grpc_requests_total{code="OK",method="ShouldRateLimit"} 2`, `edgelimit_check_duration_seconds_count{api="grpc"} 2`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := rls.ShouldRateLimit(ctx, req); err == nil {
		t.Fatal("gRPC still answers after shutdown")
	}
}
