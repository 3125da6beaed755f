package websocket

// CloseCode exposes closeCode to the tests of package websocket_test.
var CloseCode = closeCode
