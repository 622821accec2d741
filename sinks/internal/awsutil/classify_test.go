package awsutil

import (
	"context"
	"errors"
	"net/http"
	"testing"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/changegate/changegate/sinks"
)

// A refused call's error carries the answer's HTTP status, the AWS error
// code and its message (what the delivery's observers record); an entry's
// failure its code and message.
func TestClassifyCallAnswer(t *testing.T) {
	api := &smithy.GenericAPIError{Code: "AccessDenied", Message: "not allowed\n"}
	err := &awshttp.ResponseError{ResponseError: &smithyhttp.ResponseError{
		Response: &smithyhttp.Response{Response: &http.Response{StatusCode: 403}}, Err: api}}
	var de *sinks.Error
	if !errors.As(ClassifyCall(context.Background(), "sqs q", err), &de) {
		t.Fatal("not a *sinks.Error")
	}
	if !de.Permanent || de.Reason != "AccessDenied" || de.Status != 403 || de.Code != "AccessDenied" || de.Answer != "not allowed" {
		t.Errorf("ClassifyCall = %+v", de)
	}
	e := EntryError("sqs q", "orders:1", "InternalError", "try again", false)
	if e.Permanent || e.Code != "InternalError" || e.Answer != "try again" || e.Status != 0 {
		t.Errorf("EntryError = %+v", e)
	}
}
