// The kiln binary: everything lives in the libraries; see cli/app.cc for the commands.
#include "cli/app.h"

int main(int argc, char** argv) { return kiln::cli::main(argc, argv); }
