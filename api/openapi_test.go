package api

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/subscription"
	"github.com/changegate/changegate/test/mongotest"
)

type stubBackfills struct{ Backfills }
type stubGateway struct{ Gateway }

func (stubGateway) Config() *config.Config { return &config.Config{} }

type stubDeliveries struct{ Deliveries }

// openAPIValidator returns a validator of openapi.json, failing t when the
// document is not valid OpenAPI 3.1.
func openAPIValidator(t *testing.T) (libopenapi.Document, validator.Validator) {
	t.Helper()
	doc, err := libopenapi.NewDocument(openAPI)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("openapi.json: %v", e)
		}
	}
	return doc, v
}

// TestOpenAPIDescribesEveryRoute: every route New registers under /api/v1
// (and the probes and /metrics) is in openapi.json and every path+method
// described there is a registered route; the document is valid OpenAPI 3.1
// by libopenapi-validator and is what GET /api/v1/openapi.json serves.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	s := New(Options{Gateway: stubGateway{}, Backfills: stubBackfills{}, Deliveries: stubDeliveries{}, Subscriptions: &Subscriptions{}, Registry: prometheus.NewRegistry()})
	var registered []string
	for _, p := range s.patterns {
		registered = append(registered, strings.ReplaceAll(p, "...}", "}"))
	}
	doc, _ := openAPIValidator(t)
	model, err := doc.BuildV3Model()
	if err != nil {
		t.Fatal(err)
	}
	if got := model.Model.Version; got != "3.1.0" {
		t.Errorf("openapi %q, want 3.1.0", got)
	}
	var described []string
	for path, item := range model.Model.Paths.PathItems.FromOldest() {
		for method := range item.GetOperations().FromOldest() {
			described = append(described, strings.ToUpper(method)+" "+path)
		}
	}
	for _, r := range registered {
		if !slices.Contains(described, r) {
			t.Errorf("route %q is not described in api/openapi.json", r)
		}
	}
	for _, d := range described {
		if !slices.Contains(registered, d) {
			t.Errorf("openapi.json describes %q, which is no route", d)
		}
	}

	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/openapi.json", nil))
	body, _ := io.ReadAll(rec.Body)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" || string(body) != string(openAPI) {
		t.Errorf("GET /api/v1/openapi.json: %d %q, %d bytes", rec.Code, rec.Header().Get("Content-Type"), len(body))
	}
}

// Tokens of subscriptionFixture's configuration.
const (
	fixtureAdmin = "admin-token-0123456789"
	fixtureTeamA = "team-a-token-0123456789"
	fixtureTeamB = "team-b-token-0123456789"
	// fixtureTeamDot is a token scoped to "team.a-" (not in the fixture's
	// configuration: TestScopedReads adds it).
	fixtureTeamDot = "team-dot-token-0123456789"
)

// fixtureToken is a [[server.tokens]] entry.
type fixtureToken struct{ name, token, prefix string }

func (f fixtureToken) config() config.Token {
	return config.Token{Name: f.name, Token: config.Secret(f.token), Prefix: f.prefix}
}

// fixtureGateway is a Gateway with a fixed configuration and nothing
// running.
type fixtureGateway struct {
	Gateway
	cfg *config.Config
}

func (g fixtureGateway) Config() *config.Config { return g.cfg }

// subscriptionFixture returns a Server serving /api/v1/subscriptions from
// a store on a fresh database, with the admin token, tokens scoped to
// team-a- and team-b-, a source "orders", and in the file a rule
// "paid-orders" routing to sinks "billing" and "team-a-legacy".
func subscriptionFixture(t *testing.T, o Options) *Server {
	t.Helper()
	cfg := &config.Config{
		Server: config.Server{AdminToken: fixtureAdmin, Tokens: []config.Token{
			{Name: "team-a", Token: fixtureTeamA, Prefix: "team-a-"},
			{Name: "team-b", Token: fixtureTeamB, Prefix: "team-b-"},
		}},
		Sources: []config.Source{{Name: "orders", Database: "shop", Collection: "orders"}},
		// The file's own rule and sinks: listed read-only.
		Rules: []config.Rule{{Name: "paid-orders", Source: "orders", Operations: []string{"insert"},
			Filter: bson.D{{Key: "fullDocument.status", Value: "paid"}}, Sinks: []string{"billing", "team-a-legacy"}, Shape: config.Shape{Envelope: config.EnvelopeFull}}},
		Sinks: []config.Sink{
			{Name: "billing", Type: config.SinkWebhook, BatchSize: 1, Ordering: config.OrderingKey, Webhook: &config.WebhookSink{URL: "https://billing.example.com/hook?token=url-credential"}},
			{Name: "team-a-legacy", Type: config.SinkWebhook, BatchSize: 10, MaxInFlight: 4, Transactions: config.TransactionsGroup, Ordering: config.OrderingKey, Webhook: &config.WebhookSink{URL: "https://a.example.com/legacy"}},
		},
		Subscriptions: config.Subscriptions{Enabled: true, MaxSubscriptions: 10},
	}
	if o.Gateway == nil {
		o.Gateway = fixtureGateway{cfg: cfg}
	}
	sealer, err := subscription.NewSealer(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	store := subscription.NewStore(mongotest.Database(t, "cgtest_api_"), subscription.Options{Sealer: sealer, Log: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := store.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	o.Subscriptions = &Subscriptions{Store: store, File: func() *config.Config { return cfg }}
	return New(o)
}

// call serves one request on s: method, path, bearer token, body.
func call(s *Server, method, path, token, body string) *http.Response {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec.Result()
}

// TestOpenAPIDescribesResponses: real requests to the subscriptions'
// handlers and their answers (created with its secret, listed, shown,
// patched, paused, rotated, deleted, and errors: a bad body, another
// team's name, no token) validate against openapi.json, request and
// response, so that the document cannot drift from what the handlers
// send; an answer with a member the document does not know is refused.
func TestOpenAPIDescribesResponses(t *testing.T) {
	_, v := openAPIValidator(t)
	s := subscriptionFixture(t, Options{})
	const create = `{"name":"team-a-orders","source":"orders","operations":["insert","update"],"filter":{"fullDocument.total":{"$gte":100}},` +
		`"fields":{"fullDocument.card":0},"redact":["fullDocument.email"],"envelope":"full",` +
		`"sink":{"type":"webhook","url":"https://a.example.com/hooks","headers":{"X-Key":"k"},"batch_size":10,"transactions":"group","max_in_flight":"auto"}}`
	for _, tc := range []struct {
		method, path, token, body string
		want                      int
		// badRequest: the request itself breaks the document (to be
		// refused); only the answer is validated.
		badRequest bool
	}{
		{"POST", "/api/v1/subscriptions", fixtureTeamA, create, 201, false},
		{"POST", "/api/v1/subscriptions", fixtureTeamA, create, 409, false},
		{"POST", "/api/v1/subscriptions", fixtureTeamA, `{"name":"team-a-x","source":"orders","colour":"red","sink":{"type":"webhook","url":"https://a.example.com/"}}`, 400, true},
		{"POST", "/api/v1/subscriptions", fixtureTeamA, `{"name":"team-b-x","source":"orders","sink":{"type":"webhook","url":"https://b.example.com/"}}`, 403, false},
		{"GET", "/api/v1/subscriptions", fixtureTeamA, "", 200, false},
		{"GET", "/api/v1/subscriptions?limit=1", fixtureAdmin, "", 200, false},
		{"GET", "/api/v1/subscriptions", "", "", 401, true},
		{"GET", "/api/v1/subscriptions/team-a-orders", fixtureTeamA, "", 200, false},
		{"GET", "/api/v1/subscriptions/team-a-nothing", fixtureTeamA, "", 404, false},
		{"PATCH", "/api/v1/subscriptions/team-a-orders", fixtureTeamA, `{"envelope":"key","sink":{"batch_size":5}}`, 200, false},
		{"POST", "/api/v1/subscriptions/team-a-orders/pause", fixtureTeamA, `{"reason":"maintenance"}`, 200, false},
		{"POST", "/api/v1/subscriptions/team-a-orders/resume", fixtureTeamA, "", 200, false},
		{"POST", "/api/v1/subscriptions/team-a-orders/rotate-secret", fixtureTeamA, `{"overlap":"1h"}`, 200, false},
		{"DELETE", "/api/v1/subscriptions/team-a-orders", fixtureTeamA, "", 200, false},
	} {
		name := fmt.Sprintf("%s %s %d", tc.method, tc.path, tc.want)
		resp := call(s, tc.method, tc.path, tc.token, tc.body)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.want {
			t.Errorf("%s: got %d %s", name, resp.StatusCode, body)
			continue
		}
		if ok, errs := validateExchange(v, tc.method, tc.path, tc.token, tc.body, resp, body, tc.badRequest); !ok {
			for _, e := range errs {
				t.Errorf("%s: %s", name, e)
			}
			t.Logf("%s: answered %s", name, body)
		}
		if tc.want == 201 {
			// The document refuses a member it does not describe.
			drifted := bytes.Replace(body, []byte(`"status"`), []byte(`"colour": "red", "status"`), 1)
			if ok, _ := validateExchange(v, tc.method, tc.path, tc.token, tc.body, resp, drifted, false); ok {
				t.Errorf("%s: an answer with an undescribed member validates", name)
			}
		}
	}
}

// validateExchange validates the request (method, path, token, body) and
// the response resp, whose body is body, against the document; with
// responseOnly, the response alone.
func validateExchange(v validator.Validator, method, path, token, reqBody string, resp *http.Response, body []byte, responseOnly bool) (bool, []string) {
	req := httptest.NewRequest(method, "http://localhost"+path, strings.NewReader(reqBody))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if reqBody != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	r := *resp
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.Request = req
	validate := v.ValidateHttpRequestResponse
	if responseOnly {
		validate = v.ValidateHttpResponse
	}
	ok, errs := validate(req, &r)
	var out []string
	for _, e := range errs {
		msg := e.Error()
		for _, se := range e.SchemaValidationErrors {
			msg += "; " + se.FieldPath + ": " + se.Reason
		}
		out = append(out, msg)
	}
	return ok, out
}
