package console

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/subscription"
	"github.com/changegate/changegate/test/mongotest"
)

const (
	subsAdmin = "admin-token-admin-token"
	subsTeamA = "team-a-token-team-a-token"
	subsTeamB = "team-b-token-team-b-token"
)

// The subscriptions page lists what the request's token manages (a scoped
// token its prefix only), needs a token even with console_auth "none",
// shows hostile names, filters, URLs and reasons as text, and never a
// secret or a header value.
func TestConsoleSubscriptionsPage(t *testing.T) {
	cfg := &config.Config{
		Server: config.Server{Console: true, PublicRead: true, AdminToken: subsAdmin, Tokens: []config.Token{
			{Name: "team-a", Token: subsTeamA, Prefix: "team-a-"},
			{Name: "team-b", Token: subsTeamB, Prefix: "team-b-"},
		}},
		Sources:       []config.Source{{Name: "orders", Database: "shop", Collection: "orders"}},
		Subscriptions: config.Subscriptions{Enabled: true, MaxSubscriptions: 10},
	}
	sealer, err := subscription.NewSealer(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	store := subscription.NewStore(mongotest.Database(t, "cgtest_console_"), subscription.Options{Sealer: sealer, Log: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := store.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	gw := fixedGateway{cfg: cfg}
	admin := api.New(api.Options{Gateway: gw, Subscriptions: &api.Subscriptions{Store: store, File: func() *config.Config { return cfg }}})
	New(admin, Options{Gateway: gw})
	do := func(method, path, token, body string) (int, string) {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		admin.ServeHTTP(w, req)
		b, _ := io.ReadAll(w.Result().Body)
		return w.Code, string(b)
	}
	hostileJSON, _ := json.Marshal(hostile)
	var secrets []string
	for _, c := range []struct{ token, body string }{
		{subsTeamA, `{"name":"team-a-orders","source":"orders","operations":["insert"],"filter":{"fullDocument.s":` + string(hostileJSON) + `},` +
			`"redact":["fullDocument.email"],"sink":{"type":"webhook","url":"https://a.example.com/h?x=%3Cscript%3E","headers":{"X-Key":"header-value-never-shown"},"batch_size":5}}`},
		{subsAdmin, `{"name":"team-b-other","source":"orders","sink":{"type":"webhook","url":"https://b.example.com/"}}`},
	} {
		code, out := do("POST", "/api/v1/subscriptions", c.token, c.body)
		var created struct{ Secret string }
		if code != 201 || json.Unmarshal([]byte(out), &created) != nil || created.Secret == "" {
			t.Fatalf("create: %d %s", code, out)
		}
		secrets = append(secrets, created.Secret)
	}
	if code, out := do("POST", "/api/v1/subscriptions/team-a-orders/pause", subsTeamA, `{"reason":`+string(hostileJSON)+`}`); code != 200 {
		t.Fatalf("pause: %d %s", code, out)
	}

	// No token: the shell, even with console_auth "none".
	code, body := do("GET", "/ui/subscriptions", "", "")
	if code != 401 || !strings.Contains(body, "data-locked") || strings.Contains(body, "team-a-orders") || !strings.Contains(body, "Subscriptions are shown only with a token") {
		t.Fatalf("without a token: %d\n%s", code, body)
	}
	code, body = do("GET", "/ui/subscriptions", subsTeamA, "")
	if code != 200 || !strings.Contains(body, `data-name="team-a-orders" data-status="paused" data-revision="2"`) || strings.Contains(body, "team-b-other") ||
		!strings.Contains(body, `data-action="sub-resume"`) || !strings.Contains(body, "headers X-Key (values not shown)") {
		t.Fatalf("team-a's page: %d\n%s", code, body)
	}
	noHostileMarkup(t, "subscriptions", body)
	if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Errorf("the hostile reason and filter are not shown escaped")
	}
	code, body = do("GET", "/ui/subscriptions", subsAdmin, "")
	if code != 200 || !strings.Contains(body, `data-name="team-a-orders"`) || !strings.Contains(body, `data-name="team-b-other" data-status="active"`) {
		t.Fatalf("admin's page: %d\n%s", code, body)
	}
	for _, never := range append(secrets, "header-value-never-shown", "whsec_") {
		if strings.Contains(body, never) {
			t.Errorf("the page shows %q", never)
		}
	}
	if code, _ := do("GET", "/ui/subscriptions?after=%21%21", subsAdmin, ""); code != 400 {
		t.Errorf("bad cursor: %d", code)
	}
	// Disabled: the page says so; no token at all configured: 403.
	cfg.Subscriptions.Enabled = false
	if code, body := do("GET", "/ui/subscriptions", subsAdmin, ""); code != 200 || !strings.Contains(body, `id="subscriptions-off"`) {
		t.Errorf("disabled: %d\n%s", code, body)
	}
	cfg.Server.AdminToken, cfg.Server.Tokens = "", nil
	if code, body := do("GET", "/ui/subscriptions", "", ""); code != 403 || !strings.Contains(body, "Subscriptions need a token") {
		t.Errorf("no token configured: %d\n%s", code, body)
	}
}
