package mongowire

import (
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// FailPoint arms fault injection for commands, modelled on the server's
// failCommand fail point. When an armed fail point matches a command it
// first blocks for BlockFor (if set), then either closes the connection
// (CloseConnection), fails the command with ErrorCode and ErrorLabels, or,
// with neither, runs the command normally. With DropReply the command runs
// and the connection is closed instead of replying, as if the network
// failed after the server applied a write.
type FailPoint struct {
	// Commands lists the command names the fail point applies to, e.g. "getMore".
	Commands []string
	// Times is how many matching commands trigger the fail point before it
	// disarms itself; 0 means until ClearFailPoints.
	Times int
	// Skip is how many matching commands pass unaffected before it triggers.
	Skip int
	// ErrorCode fails the command with this code (ok: 0).
	ErrorCode int32
	// ErrorLabels are attached to the error, e.g. "ResumableChangeStreamError".
	ErrorLabels []string
	// CloseConnection closes the connection without replying.
	CloseConnection bool
	// BlockFor delays the command (blockConnection/blockTimeMS).
	BlockFor time.Duration
	// AppName restricts the fail point to clients with this application name.
	AppName string
	// DropReply runs the command, then closes the connection without
	// replying (a mongowire extension).
	DropReply bool
	// AfterCursorCheckout models the server's failGetMoreAfterCursorCheckout
	// fail point: the getMore fails with ErrorCode after checking out its
	// cursor, so the server labels the error as for a real failure of the
	// cursor (ResumableChangeStreamError for a change stream and a
	// resumable code). A failCommand fault fires before the checkout: a
	// getMore error without ErrorLabels then has no label.
	AfterCursorCheckout bool
	// WriteConcernError, when set, lets the command run and adds
	// writeConcernError {code, codeName, errmsg} to its reply (failCommand's
	// data.writeConcernError), with the labels the server derives from it
	// unless ErrorLabels is set.
	WriteConcernError *WriteConcernError
}

// WriteConcernError is the writeConcernError of a FailPoint.
type WriteConcernError struct {
	Code     int32
	CodeName string
	Message  string
	// Info is the optional errInfo document.
	Info bson.Raw
}

type failPoint struct {
	FailPoint
	remaining int // for Times > 0
	skip      int
}

// FailCommand arms a fail point. Several may be armed at once; the first
// armed one that matches a command applies. It is safe for concurrent use.
func (s *Server) FailCommand(fp FailPoint) {
	s.fpMu.Lock()
	defer s.fpMu.Unlock()
	s.failPoints = append(s.failPoints, &failPoint{FailPoint: fp, remaining: fp.Times, skip: fp.Skip})
}

// ClearFailPoints disarms every fail point.
func (s *Server) ClearFailPoints() {
	s.fpMu.Lock()
	defer s.fpMu.Unlock()
	s.failPoints = nil
}

// clearFailPoints disarms the fail points of one kind (failCommand or
// failGetMoreAfterCursorCheckout).
func (s *Server) clearFailPoints(afterCheckout bool) {
	s.fpMu.Lock()
	defer s.fpMu.Unlock()
	s.failPoints = slices.DeleteFunc(s.failPoints, func(fp *failPoint) bool { return fp.AfterCursorCheckout == afterCheckout })
}

func (s *Server) matchFailPoint(name, appName string) *FailPoint {
	if name == "configureFailPoint" {
		return nil
	}
	s.fpMu.Lock()
	defer s.fpMu.Unlock()
	for i, fp := range s.failPoints {
		if !slices.Contains(fp.Commands, name) || fp.AppName != "" && fp.AppName != appName {
			continue
		}
		if fp.skip > 0 {
			fp.skip--
			continue
		}
		if fp.Times > 0 {
			fp.remaining--
			if fp.remaining <= 0 {
				s.failPoints = slices.Delete(s.failPoints, i, i+1)
			}
		}
		out := fp.FailPoint
		return &out
	}
	return nil
}

// cmdConfigureFailPoint implements
// {configureFailPoint: "failCommand", mode: "alwaysOn"|"off"|{times: n}|{skip: n}, data: {...}}.
// It replaces all armed fail points, like the server's single failCommand.
func (s *Server) cmdConfigureFailPoint(cmd *command, dst []byte) ([]byte, error) {
	if cmd.db != "admin" {
		return nil, cmdErr(13, "configureFailPoint may only be run against the admin database.")
	}
	name, _ := cmd.body.Lookup("configureFailPoint").StringValueOK()
	if name != "failCommand" && name != "failGetMoreAfterCursorCheckout" {
		return nil, cmdErr(codeBadValue, "mongowire supports only the failCommand and failGetMoreAfterCursorCheckout fail points, not %q", name)
	}
	afterCheckout := name == "failGetMoreAfterCursorCheckout"
	fp := FailPoint{AfterCursorCheckout: afterCheckout}
	if afterCheckout {
		fp.Commands = []string{"getMore"}
	}
	mode := cmd.body.Lookup("mode")
	switch {
	case mode.Type == bson.TypeString && mode.StringValue() == "off":
		s.clearFailPoints(afterCheckout)
		idx, dst := bsoncore.AppendDocumentStart(dst)
		dst = bsoncore.AppendInt32Element(dst, "count", 0)
		return s.appendOK(dst, idx), nil
	case mode.Type == bson.TypeString && mode.StringValue() == "alwaysOn":
	case mode.Type == bson.TypeEmbeddedDocument:
		if v, err := mode.Document().LookupErr("times"); err == nil {
			fp.Times = int(num(v))
			if fp.Times <= 0 {
				s.clearFailPoints(afterCheckout)
				idx, dst := bsoncore.AppendDocumentStart(dst)
				dst = bsoncore.AppendInt32Element(dst, "count", 0)
				return s.appendOK(dst, idx), nil
			}
		}
		if v, err := mode.Document().LookupErr("skip"); err == nil {
			fp.Skip = int(num(v))
		}
	default:
		return nil, cmdErr(codeBadValue, "invalid fail point mode %v", mode)
	}
	data, _ := cmd.body.Lookup("data").DocumentOK()
	if arr, ok := data.Lookup("failCommands").ArrayOK(); ok {
		vals, _ := arr.Values()
		for _, v := range vals {
			if n, ok := v.StringValueOK(); ok {
				fp.Commands = append(fp.Commands, n)
			}
		}
	}
	if len(fp.Commands) == 0 {
		return nil, cmdErr(codeBadValue, "failCommand fail point needs data.failCommands")
	}
	if v, err := data.LookupErr("errorCode"); err == nil {
		fp.ErrorCode = int32(num(v))
	}
	if arr, ok := data.Lookup("errorLabels").ArrayOK(); ok {
		vals, _ := arr.Values()
		fp.ErrorLabels = []string{}
		for _, v := range vals {
			if n, ok := v.StringValueOK(); ok {
				fp.ErrorLabels = append(fp.ErrorLabels, n)
			}
		}
	}
	fp.CloseConnection, _ = data.Lookup("closeConnection").BooleanOK()
	if b, _ := data.Lookup("blockConnection").BooleanOK(); b {
		if v, err := data.LookupErr("blockTimeMS"); err == nil {
			fp.BlockFor = time.Duration(num(v)) * time.Millisecond
		}
	}
	fp.AppName, _ = data.Lookup("appName").StringValueOK()
	fp.DropReply, _ = data.Lookup("mongowireDropReply").BooleanOK()
	if wce, ok := data.Lookup("writeConcernError").DocumentOK(); ok {
		w := &WriteConcernError{}
		if v, err := wce.LookupErr("code"); err == nil {
			w.Code = int32(num(v))
		}
		w.CodeName, _ = wce.Lookup("codeName").StringValueOK()
		w.Message, _ = wce.Lookup("errmsg").StringValueOK()
		w.Info, _ = wce.Lookup("errInfo").DocumentOK()
		fp.WriteConcernError = w
	}
	s.clearFailPoints(afterCheckout)
	s.FailCommand(fp)
	idx, dst := bsoncore.AppendDocumentStart(dst)
	dst = bsoncore.AppendInt32Element(dst, "count", 0)
	return s.appendOK(dst, idx), nil
}
