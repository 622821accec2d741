package api

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// listNames pages through GET /api/v1/subscriptions with token, limit
// per page, and returns each entry's name and managed_by, and the bodies.
func listNames(t *testing.T, s *Server, token, limit string) (names []string, bodies string) {
	t.Helper()
	after := ""
	for range 20 {
		path := "/api/v1/subscriptions?limit=" + limit
		if after != "" {
			path += "&after=" + after
		}
		resp := call(s, "GET", path, token, "")
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		bodies += string(b)
		var page struct {
			Subscriptions []struct {
				Name      string `json:"name"`
				ManagedBy string `json:"managed_by"`
			} `json:"subscriptions"`
			Next string `json:"next"`
		}
		if err := json.Unmarshal(b, &page); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, b)
		}
		for _, e := range page.Subscriptions {
			names = append(names, e.Name+"/"+e.ManagedBy)
		}
		if page.Next == "" {
			return names, bodies
		}
		after = page.Next
	}
	t.Fatal("more than 20 pages")
	return nil, ""
}

// TestSubscriptionsListConfigReadOnly: the admin's listing holds the
// file's rule and sink names (managed_by config, read-only, targets not
// shown) among the stored subscriptions (managed_by api), in name order,
// across pages; a scoped token sees only the names with its prefix; a
// change of a file's name answers 409 and says where it is defined; a
// subscription cannot take a file's name.
func TestSubscriptionsListConfigReadOnly(t *testing.T) {
	s := subscriptionFixture(t, Options{})
	_, v := openAPIValidator(t)
	for _, tc := range []struct{ token, name string }{{fixtureTeamA, "team-a-x"}, {fixtureTeamB, "team-b-y"}, {fixtureAdmin, "other"}} {
		body := `{"name":"` + tc.name + `","source":"orders","sink":{"type":"webhook","url":"https://x.example.com/"}}`
		if resp := call(s, "POST", "/api/v1/subscriptions", tc.token, body); resp.StatusCode != http.StatusCreated {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("create %s: %d %s", tc.name, resp.StatusCode, b)
		}
	}

	all := []string{"billing/config", "other/api", "paid-orders/config", "team-a-legacy/config", "team-a-x/api", "team-b-y/api"}
	for _, limit := range []string{"100", "2", "1"} {
		got, bodies := listNames(t, s, fixtureAdmin, limit)
		if !slices.Equal(got, all) {
			t.Errorf("admin, limit %s: %v, want %v", limit, got, all)
		}
		if strings.Contains(bodies, "url-credential") || strings.Contains(bodies, "billing.example.com") {
			t.Errorf("the listing shows a sink's target: %s", bodies)
		}
	}
	if got, _ := listNames(t, s, fixtureTeamA, "1"); !slices.Equal(got, []string{"team-a-legacy/config", "team-a-x/api"}) {
		t.Errorf("team-a: %v", got)
	}
	if got, _ := listNames(t, s, fixtureTeamB, "100"); !slices.Equal(got, []string{"team-b-y/api"}) {
		t.Errorf("team-b: %v", got)
	}

	resp := call(s, "GET", "/api/v1/subscriptions/paid-orders", fixtureAdmin, "")
	b, _ := io.ReadAll(resp.Body)
	var entry struct {
		ManagedBy string `json:"managed_by"`
		Rule      struct {
			Source string         `json:"source"`
			Filter map[string]any `json:"filter"`
			Sinks  []string       `json:"sinks"`
		} `json:"rule"`
	}
	_ = json.Unmarshal(b, &entry)
	if resp.StatusCode != 200 || entry.ManagedBy != "config" || entry.Rule.Source != "orders" || entry.Rule.Filter["fullDocument.status"] != "paid" ||
		!slices.Equal(entry.Rule.Sinks, []string{"billing", "team-a-legacy"}) {
		t.Errorf("show paid-orders: %d %s", resp.StatusCode, b)
	}
	if ok, errs := validateExchange(v, "GET", "/api/v1/subscriptions/paid-orders", fixtureAdmin, "", resp, b, false); !ok {
		t.Errorf("show paid-orders against openapi.json: %v", errs)
	}

	for _, tc := range []struct {
		method, path, token, body string
		want                      int
	}{
		{"PATCH", "/api/v1/subscriptions/paid-orders", fixtureAdmin, `{"envelope":"key"}`, 409},
		{"DELETE", "/api/v1/subscriptions/paid-orders", fixtureAdmin, "", 409},
		{"POST", "/api/v1/subscriptions/billing/pause", fixtureAdmin, "", 409},
		{"POST", "/api/v1/subscriptions/billing/resume", fixtureAdmin, "", 409},
		{"POST", "/api/v1/subscriptions/team-a-legacy/rotate-secret", fixtureTeamA, "", 409},
		{"DELETE", "/api/v1/subscriptions/team-a-legacy", fixtureTeamA, "", 409},
		{"DELETE", "/api/v1/subscriptions/billing", fixtureTeamA, "", 403},
		{"GET", "/api/v1/subscriptions/paid-orders", fixtureTeamA, "", 403},
	} {
		resp := call(s, tc.method, tc.path, tc.token, tc.body)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.want || tc.want == 409 && !strings.Contains(string(b), "is defined in the configuration file") {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, resp.StatusCode, b, tc.want)
		}
	}
	// Names are one namespace: a subscription cannot take the file's.
	resp = call(s, "POST", "/api/v1/subscriptions", fixtureAdmin, `{"name":"billing","source":"orders","sink":{"type":"webhook","url":"https://x.example.com/"}}`)
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(b), `$.name: \"billing\" is the name of a sink or rule of the configuration file`) {
		t.Errorf("create billing: %d %s", resp.StatusCode, b)
	}
	// The file's entry is still there, unchanged.
	if got, _ := listNames(t, s, fixtureAdmin, "100"); !slices.Equal(got, all) {
		t.Errorf("after the refused changes: %v", got)
	}

	// A subscription stored before the file took its name (not applied)
	// can be deleted: the stored one goes, the file's entry stays.
	spec := []byte(`{"name":"team-a-legacy","source":"orders","sink":{"type":"webhook","url":"https://x.example.com/"}}`)
	if _, _, err := s.subs.Store.Create(context.Background(), "admin", "team-a-legacy", spec, 10); err != nil {
		t.Fatal(err)
	}
	resp = call(s, "DELETE", "/api/v1/subscriptions/team-a-legacy", fixtureTeamA, "")
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"purge_at"`) {
		t.Fatalf("delete of the shadowed stored team-a-legacy: %d %s", resp.StatusCode, b)
	}
	if _, err := s.subs.Store.Get(context.Background(), "team-a-legacy"); err == nil {
		t.Error("the stored team-a-legacy is still there")
	}
	if got, _ := listNames(t, s, fixtureAdmin, "100"); !slices.Equal(got, all) {
		t.Errorf("after deleting the shadowed one: %v", got)
	}
	resp = call(s, "DELETE", "/api/v1/subscriptions/team-a-legacy", fixtureTeamA, "")
	if resp.StatusCode != 409 {
		t.Errorf("a second delete of team-a-legacy: %d, want 409 (the file's)", resp.StatusCode)
	}
}
