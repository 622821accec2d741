package tracing

import (
	"context"
	"net/http"
)

// benchOneChange runs the hooks of one change as the router and a webhook
// sink call them: the route and the delivery are made under the source's
// dispatch lock (held spans), the rest outside.
func benchOneChange(ctx context.Context, tr *Tracer, info ChangeInfo, rules, sinks []string, h http.Header) {
	var ch *Change
	if tr != nil {
		ch = tr.StartChange(info)
		ch.HoldSpans()
	}
	if ch != nil {
		ch.Route(rules, sinks)
	}
	var d *Delivery
	if ch != nil {
		d = ch.Delivery("hook", "webhook")
		ch.ReleaseSpans()
	}
	actx, a := tr.StartAttempt(ctx, []*Delivery{d}, AttemptInfo{Sink: "hook", Kind: "webhook", Number: 1, Propagate: true})
	a.Admitted()
	InjectHTTP(actx, h)
	SetHTTPStatus(actx, 200)
	a.TraceID()
	a.End(nil)
	d.Outcome("delivered", "")
	d.End()
	ch.Ack()
}
