fn main() {
    std::process::exit(strata::cli::main());
}
