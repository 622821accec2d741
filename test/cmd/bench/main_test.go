package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/changegate/changegate/sinks/webhook"
)

// TestMain lets the test binary play the child roles, as the bench binary
// does when it re-executes itself.
func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// TestSmoke runs every scenario with tiny sizes, changegate in the gateway
// role of this (test) binary.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several child processes")
	}
	var out, log bytes.Buffer
	code := benchMain([]string{"-quick", "-scenarios", "all,minimal", "-n", "300", "-naive-n", "100", "-backlog", "500",
		"-rate", "200", "-duration", "500ms", "-changegate", "self", "-timeout", "30s"}, &out, &log)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), log.String())
	}
	for _, want := range []string{"| 1 | drain", "| 2 | HTTP", "| 3 | naive", "| 4 |", "| 5 |", "| 6 |", "| 7 |", "| 8 |", "| 9 |", "| 15 | minimal consumer", "× the minimal consumer's (row 15, same run)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report has no %q row:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "FAILED") {
		t.Errorf("a scenario failed:\n%s", out.String())
	}
}

// TestSmokeLimits runs scenarios 10 and 11 with tiny sizes: the defaults and
// one fixed max_in_flight against a 20 ms receiver and the 32-slot one.
func TestSmokeLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several child processes")
	}
	var out, log bytes.Buffer
	code := benchMain([]string{"-scenarios", "limits", "-latencies", "20ms", "-sweep", "16", "-run-time", "1s",
		"-rate-cap", "2000", "-changegate", "self", "-timeout", "30s"}, &out, &log)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), log.String())
	}
	for _, want := range []string{"| 10 | latency 20ms | auto (default) |", "| 10 | latency 20ms | 16 |", "| 11 | 32 slots", "| 11 | 32 slots × 50ms, 429 above | 16 |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report has no %q row:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "FAILED") {
		t.Errorf("a scenario failed:\n%s", out.String())
	}
}

// TestSmokeReplicas runs scenario 12 with a tiny backlog: the ceilings and
// 1 and 2 replicas in cluster mode over 4 partitions. It checks that every
// row ran (no FAILED: nothing lost, the units spread, no process exited),
// not how fast. -timeout only bounds a stuck row: 2m, as a loaded machine
// (several test processes on 2 cores) runs the rows' processes many times
// slower than an idle one, where the whole test takes about 30 s.
func TestSmokeReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several child processes")
	}
	var out, log bytes.Buffer
	code := benchMain([]string{"-scenarios", "replicas", "-replicas", "1,2", "-replicas-n", "600",
		"-changegate", "self", "-timeout", "2m"}, &out, &log)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), log.String())
	}
	for _, want := range []string{"| ceiling: drain", "| ceiling: receiver", "| ceiling: one process", "| 1 replica(s) in cluster mode | 1 × 16 | 4 |", "| 2 replica(s) in cluster mode | 2 × 16 | 2/2 |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report has no %q row:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "FAILED") {
		t.Errorf("a scenario failed:\n%s", out.String())
	}
}

// TestMinimalSignIsTheSinksSignature: the minimal consumer signs as the
// webhook sink does, so it pays for the same work.
func TestMinimalSignIsTheSinksSignature(t *testing.T) {
	key, err := webhook.DecodeSecret(benchSecret)
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Unix(1700000000, 0)
	body := []byte(`{"id":"x"}`)
	want, err := webhook.Sign([]string{benchSecret}, "msg_1", ts, body)
	if err != nil {
		t.Fatal(err)
	}
	mac := hmac.New(sha256.New, key)
	for i := 0; i < 2; i++ { // the state is reused
		if got := minimalSign(mac, "msg_1", "1700000000", body); got != want {
			t.Fatalf("minimalSign = %q, webhook.Sign = %q", got, want)
		}
	}
}
