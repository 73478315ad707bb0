pub mod btf;
