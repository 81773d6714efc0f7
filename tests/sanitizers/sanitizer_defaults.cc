// Default options of the sanitizer runtimes, linked into every executable of
// a sanitizer build (sanitizers.cmake), so a test, hsdpd started by a test
// and a fuzz target behave alike without environment variables. The
// environment (ASAN_OPTIONS, ...) still overrides each option;
// tools/scripts/run_hardening.sh adds log_path there so that a report from
// any process, a daemon a test started included, fails the run.
//
// Suppressions name only code that is not ours (Debian's uninstrumented
// libraries); each one says why in its file.
#ifndef HSDP_SANITIZE_SUPPRESSIONS_DIR
#error "HSDP_SANITIZE_SUPPRESSIONS_DIR must name tests/sanitizers"
#endif

#define HSDP_SUPP(file) "suppressions=" HSDP_SANITIZE_SUPPRESSIONS_DIR "/" file

extern "C" {

// Stops at the first error. detect_leaks: LeakSanitizer runs at exit.
// A process that dies of a signal it did not handle reports nothing, which is
// what the tests that kill trainers do on purpose.
__attribute__((visibility("default"), used)) const char* __asan_default_options() {
  return "detect_leaks=1:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0:"
         "check_initialization_order=1:strict_init_order=1:detect_odr_violation=0:"
         "handle_abort=1:allocator_may_return_null=1";
}

__attribute__((visibility("default"), used)) const char* __lsan_default_options() {
  return HSDP_SUPP("lsan.supp") ":print_suppressions=0";
}

__attribute__((visibility("default"), used)) const char* __ubsan_default_options() {
  return "print_stacktrace=1:halt_on_error=1:" HSDP_SUPP("ubsan.supp");
}

// Reports go on (one process may show several races); the exit status is 66
// when there was any, which fails the test.
__attribute__((visibility("default"), used)) const char* __tsan_default_options() {
  return "halt_on_error=0:second_deadlock_stack=1:history_size=4:report_signal_unsafe=0:"
         "die_after_fork=0:" HSDP_SUPP("tsan.supp") ":print_suppressions=0";
}

}  // extern "C"
