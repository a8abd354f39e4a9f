package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRunLoad: "edgelimit load" names its seed and the distinct keys it
// sent, in the table and in the JSON report.
func TestRunLoad(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"overall_code":"OK"}`))
	}))
	defer srv.Close()
	args := []string{"--url", srv.URL, "-c", "2", "-n", "400", "--dist", "uniform", "--keys", "20", "--seed", "7"}
	var out bytes.Buffer
	if err := runLoad(args, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 connections, dist uniform over 20 keys, seed 7\n", "distinct keys sent: 20 of 20 (100.0%)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := runLoad(append(args, "--json", "--batch", "3"), &out); err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Seed      uint64 `json:"seed"`
		KeySpace  int64  `json:"key_space"`
		Distinct  int64  `json:"distinct_keys_sent"`
		Decisions int64  `json:"decisions"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.Seed != 7 || rep.KeySpace != 20 || rep.Distinct != 20 || rep.Decisions != 1200 {
		t.Errorf("JSON report %+v (%v):\n%s", rep, err, out.String())
	}
}
