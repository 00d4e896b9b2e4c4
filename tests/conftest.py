import signal

# The Ctrl-C tests (tests/emulator/*root*) send SIGINT to `emulator run`. A shell that starts the
# suite in the background (`cmd &` without job control, as some CI wrappers do) leaves SIGINT
# ignored, and an ignored signal stays ignored across exec, so Python in the child never raises
# KeyboardInterrupt. A handled signal is reset to the default on exec: handle it here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden files from the current code (review the diff!)")
