package tracing

import (
	"context"
	"net/http"
)

// benchOneChange runs the hooks of one change as the router and a webhook
// sink call them.
func benchOneChange(ctx context.Context, tr *Tracer, info ChangeInfo, rules, sinks []string, h http.Header) {
	var ch *Change
	if tr != nil {
		ch = tr.StartChange(info)
	}
	if ch != nil {
		ch.Route(rules, sinks)
	}
	var d *Delivery
	if ch != nil {
		d = ch.Delivery("hook", "webhook")
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
