package console

import (
	"encoding/json"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/subscription"
)

// consoleSubsLimit is the subscriptions page's size.
const consoleSubsLimit = 50

// consoleOperations are the operation types the create form offers.
var consoleOperations = []string{"insert", "update", "replace", "delete"}

// consoleSubscriptions is the subscriptions page: the subscriptions the
// request's token manages (all for the admin token, its prefix's for a
// [[server.tokens]] one) and the form that creates one.
type consoleSubscriptions struct {
	// Enabled is [subscriptions] enabled; without it the page says so.
	Enabled bool
	// Token names the request's token; Prefix is its prefix (empty for
	// the admin token).
	Token, Prefix string
	Sources       []string
	Operations    []string
	Subs          []consoleSub
	Next, First   template.URL
}

// consoleSub is one subscription as the page shows it: its JSON form as
// the API shows it (header values redacted, no secret).
type consoleSub struct {
	Name, Source, Status, Reason string
	Operations                   []string
	Filter, Fields               string
	Redact                       []string
	Envelope                     string
	URL                          string
	// Sink are its webhook's other settings, as "batch 5".
	Sink                 []string
	Headers              []string // names only
	Revision             int64
	CreatedAt, UpdatedAt time.Time
	Secrets              []consoleSecret
}

type consoleSecret struct {
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at"`
}

// subView renders sub from its API form (subscription.Subscription's
// MarshalJSON), so that the page shows no more than the API does.
func subView(sub subscription.Subscription) (consoleSub, error) {
	b, err := json.Marshal(sub)
	if err != nil {
		return consoleSub{}, err
	}
	var f struct {
		Name, Source, Status, Reason, Envelope string
		Operations                             []string
		Filter, Fields                         json.RawMessage
		Redact                                 []string
		Sink                                   struct {
			URL          string            `json:"url"`
			Headers      map[string]string `json:"headers"`
			BatchSize    json.RawMessage   `json:"batch_size"`
			Transactions string            `json:"transactions"`
			MaxInFlight  json.RawMessage   `json:"max_in_flight"`
		}
		Revision       int64
		CreatedAt      time.Time       `json:"created_at"`
		UpdatedAt      time.Time       `json:"updated_at"`
		SigningSecrets []consoleSecret `json:"signing_secrets"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return consoleSub{}, err
	}
	v := consoleSub{Name: f.Name, Source: f.Source, Status: f.Status, Reason: f.Reason, Operations: f.Operations,
		Filter: string(f.Filter), Fields: string(f.Fields), Redact: f.Redact, Envelope: f.Envelope, URL: f.Sink.URL,
		Revision: f.Revision, CreatedAt: f.CreatedAt, UpdatedAt: f.UpdatedAt, Secrets: f.SigningSecrets}
	for _, o := range []struct{ name, v string }{{"batch", string(f.Sink.BatchSize)}, {"transactions", f.Sink.Transactions},
		{"max in flight", strings.Trim(string(f.Sink.MaxInFlight), `"`)}} {
		if o.v != "" {
			v.Sink = append(v.Sink, o.name+" "+o.v)
		}
	}
	for h := range f.Sink.Headers {
		v.Headers = append(v.Headers, h)
	}
	slices.Sort(v.Headers)
	return v, nil
}

// consoleSubscriptionsPage fills the subscriptions page for the request's
// principal: a scoped token lists its own prefix only (api.Principal's
// ListPrefix, as GET /api/v1/subscriptions does).
func (c *Console) consoleSubscriptions(r *http.Request, p *consolePage) int {
	subs := c.api.Subscriptions()
	pr := api.PrincipalOf(r)
	d := &consoleSubscriptions{Token: pr.Name, Prefix: pr.Prefix, Operations: consoleOperations}
	p.Subscriptions = d
	if subs == nil || !subs.File().Subscriptions.Enabled {
		return http.StatusOK
	}
	d.Enabled = true
	_, d.Sources = configNames(subs.File())
	after := r.URL.Query().Get("after")
	page, err := subs.Store.List(r.Context(), subscription.ListOptions{Prefix: pr.ListPrefix(""), Cursor: after, Limit: consoleSubsLimit})
	if err != nil {
		p.Error = err.Error()
		if errors.Is(err, subscription.ErrBadCursor) {
			return http.StatusBadRequest
		}
		return http.StatusInternalServerError
	}
	for _, sub := range page.Subscriptions {
		v, err := subView(sub)
		if err != nil {
			p.Error = err.Error()
			return http.StatusInternalServerError
		}
		d.Subs = append(d.Subs, v)
	}
	if page.Next != "" {
		d.Next = template.URL("/ui/subscriptions?" + url.Values{"after": {page.Next}}.Encode())
	}
	if after != "" {
		d.First = "/ui/subscriptions"
	}
	return http.StatusOK
}
