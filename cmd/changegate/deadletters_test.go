package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/changegate/changegate/deadletter"
)

// TestReplayReportExitStatus: a replay that skipped entries because no
// current rule routes them to their sink does not exit 0 (it used to: the
// operator asked for them and nothing was delivered), and says how many per
// sink.
func TestReplayReportExitStatus(t *testing.T) {
	notRouted := fmt.Errorf("dead letter x: %w", deadletter.ErrNotRouted)
	for _, tc := range []struct {
		name    string
		res     deadletter.ReplayResult
		err     error
		code    int
		wantErr string
	}{
		{"all replayed", deadletter.ReplayResult{Replayed: 3}, nil, 0, ""},
		{"gap skipped", deadletter.ReplayResult{Replayed: 1, Skipped: 1}, nil, 0, ""},
		{"not routed", deadletter.ReplayResult{Replayed: 1, Skipped: 3, NotRouted: map[string]int{"hook": 2, "audit": 1},
			Errors: []error{notRouted, notRouted, notRouted}}, nil, exitNotRouted,
			"skipped 3 entries no current rule routes to their sink (audit 1, hook 2)"},
		{"failed and not routed", deadletter.ReplayResult{Failed: 1, Skipped: 1, NotRouted: map[string]int{"hook": 1}}, nil, 1, "(hook 1)"},
		{"error", deadletter.ReplayResult{}, errors.New("boom"), 1, "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := replayReport(tc.res, tc.err, &out, &errOut); code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tc.code, errOut.String())
			}
			if want := fmt.Sprintf("replayed %d, failed %d, skipped %d\n", tc.res.Replayed, tc.res.Failed, tc.res.Skipped); out.String() != want {
				t.Errorf("stdout %q, want %q", out.String(), want)
			}
			if !strings.Contains(errOut.String(), tc.wantErr) || (tc.wantErr == "" && errOut.Len() > 0) {
				t.Errorf("stderr %q, want %q", errOut.String(), tc.wantErr)
			}
		})
	}
}
