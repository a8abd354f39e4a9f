package httpapi

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/pop/topkeys"
)

// TestTopEndpoint: keys denied by the store and by a mitigation bit are
// counted, allowed checks are not, GET /v1/top lists them most denied first
// with their descriptions, and a bad n is a 400 naming the field.
func TestTopEndpoint(t *testing.T) {
	top := topkeys.New(8)
	srv, eng := newMitigatingServer(t, top)
	check := func(ip string) {
		post(t, srv.URL+"/v1/check", fmt.Sprintf(`{"domain":"api_platform","descriptors":[{"entries":[{"key":"ip","value":%q}]}]}`, ip))
	}
	for range 4 { // 1 allowed, 1 denied by the store (it issues a bit), 2 by the bit
		check("1.1.1.1")
	}
	for range 2 {
		check("2.2.2.2")
	}
	check("3.3.3.3") // allowed only

	resp, err := http.Get(srv.URL + "/v1/top?n=5")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Total uint64
		Keys  []topkeys.Entry
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := []topkeys.Entry{
		{Key: "api_platform ip=1.1.1.1 (minute sliding_window global)", Count: 3},
		{Key: "api_platform ip=2.2.2.2 (minute sliding_window global)", Count: 1},
	}
	if got.Total != 4 || fmt.Sprint(got.Keys) != fmt.Sprint(want) {
		t.Fatalf("GET /v1/top: total %d keys %+v; want 4, %+v", got.Total, got.Keys, want)
	}

	for _, bad := range []string{"0", "x", "1001"} {
		resp, err := http.Get(srv.URL + "/v1/top?n=" + bad)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), `"field":"n"`) {
			t.Errorf("n=%s: %d %s, want 400 naming n", bad, resp.StatusCode, b)
		}
	}
	// Hidden with the mitigations endpoint: it lists key values too.
	hidden := httptest.NewServer(New(Config{Engine: eng, TopKeys: top, HideMitigations: true}))
	defer hidden.Close()
	if resp, err := http.Get(hidden.URL + "/v1/top"); err != nil || resp.StatusCode != 404 {
		t.Errorf("GET /v1/top with HideMitigations: %v %v, want 404", resp.StatusCode, err)
	}
}
